package contain

import "context"

type fakeScoper struct{}

func (fakeScoper) StartScope(context.Context, string, string, int) (string, error) { return "", nil }
func (fakeScoper) StopScope(context.Context, string) error                         { return nil }
func (fakeScoper) Close() error                                                    { return nil }

func nopScoper(context.Context) (Scoper, error) { return fakeScoper{}, nil }
