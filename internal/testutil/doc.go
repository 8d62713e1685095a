// Package testutil holds what kc-watchman's tests share, each helper once:
// building and running the fake Kallichore supervisor (kcserver, a main
// package beside this one) and the socket server (sockserver), cgroups,
// flocks, sockets, PathExists and RandomHex. Its sub-packages drive the
// real parts the tests use: podman (a private podman per test), docker
// and containerd (the private daemons .ci starts), proc (processes and
// /proc conditions, WaitFor, Dead) and supervise (kc-hook supervise's
// fixtures).
//
// The sub-packages are named for what they drive, their package names end
// in "test" (podmantest, dockertest, containerdtest, supervisetest) so that
// a call reads as a test helper and never clashes with the engine client
// of the same name. No shipped binary links any of this:
// cmd/kc-hook's TestBinariesLinkNoTestHelper fails if one does.
package testutil
