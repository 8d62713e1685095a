package containerd

import "context"

// Version asks containerd's version service.
func (c *containerd) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AskTimeout())
	defer cancel()
	cl, err := c.open()
	if err != nil {
		return "", err
	}
	defer cl.Close()
	return cl.Version(ctx)
}
