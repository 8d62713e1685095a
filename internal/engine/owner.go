package engine

// EngineByID maps each container ID in t to the engine that vouches for
// it: the first engine (in the order asked) that lists it live, else the
// first that lists it at all. Docker's containers are containerd's too (in
// namespace moby); asked in Known order, Docker's name wins, which is the
// one the operator started them with.
func (t Truth) EngineByID() map[string]string {
	out := map[string]string{}
	live := map[string]bool{}
	for _, a := range t.Answers {
		for _, c := range a.Containers {
			if live[c.ID] {
				continue
			}
			if _, seen := out[c.ID]; !seen || c.Live {
				out[c.ID] = a.Engine
				live[c.ID] = c.Live
			}
		}
	}
	return out
}
