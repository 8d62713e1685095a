package sweep

// byOwnerTurns orders probes so that the sockets' owners take turns,
// each owner's in their order (path order): the workers start on every
// owner's first sockets, and a user whose sockets never answer spends his
// share of the deadline, not everyone's. In path order, 400 of his names
// before another user's socket used up the 30 s deadline, and that socket
// was reported not probed.
func byOwnerTurns(ps []*probe) []*probe {
	var owners []int
	by := map[int][]*probe{}
	for _, p := range ps {
		uid := p.names[0].e.uid // one inode: one owner
		if _, ok := by[uid]; !ok {
			owners = append(owners, uid)
		}
		by[uid] = append(by[uid], p)
	}
	if len(owners) < 2 {
		return ps
	}
	out := make([]*probe, 0, len(ps))
	for turn := 0; len(owners) > 0; turn++ {
		left := owners[:0]
		for _, uid := range owners {
			if turn < len(by[uid]) {
				out = append(out, by[uid][turn])
			}
			if turn+1 < len(by[uid]) {
				left = append(left, uid)
			}
		}
		owners = left
	}
	return out
}
