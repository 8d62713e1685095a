package engine

// Detection is what --engine auto finds for one engine: the endpoint it
// looks at and whether that exists on this host. doctor prints it so an
// operator can see why an engine was (or was not) asked.
type Detection struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	Found    bool   `json:"found"`
}

// Detect runs every built-in engine's Detect, in Known order: exactly
// what Select does for auto, without building any engine.
func Detect(cfg Config) []Detection {
	specsMu.Lock()
	defer specsMu.Unlock()
	var out []Detection
	for _, n := range Known {
		s, ok := specs[n]
		if !ok {
			continue
		}
		ep, found := s.Detect(cfg)
		out = append(out, Detection{Name: n, Endpoint: ep, Found: found})
	}
	return out
}
