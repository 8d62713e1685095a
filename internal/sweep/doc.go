// Package sweep finds Kallichore supervisor sockets (kc-<pid>.sock,
// kc-<pid>.<x>.sock and the hashed kc-<hex>.sock) in socket directories, on
// the host or inside a container, decides which are orphans, and unlinks
// those safely.
//
// A socket is stale only when three independent gates agree (DESIGN "Sockets"):
//
//  1. its owner is not a live supervisor: no process with that PID (in the
//     PID namespace the name was written in), or the PID is a thread ID of
//     another process, or a zombie, or its comm is not in the supervisor
//     set, or it started after the socket file was last changed (a recycled
//     PID);
//  2. no live socket holds it: connect(2) is refused and no socket at all,
//     listening or not, is bound to that path in net/unix of the socket's
//     network namespace (a socket bound and not listening refuses too);
//  3. GET /status is silent twice, a short pause apart. (An answer with a
//     process_id other than the PID in the name is not silence: gate 3 is
//     then unsure, since the name may be a hashed one that reads as a PID.
//     Nor is an answer too large to read: something listens.)
//
// Gates that disagree give the verdict "unknown": the socket is kept and
// reported. Session sockets follow their server's control socket.
//
// A hashed name (kc-<hex>.sock, Kallichore's per-session name when the
// usual path would be too long: a u64 hash printed as 1–16 lowercase hex
// digits, unpadded) names no PID, so gate 1 cannot be applied and nothing
// ties it to a server. A hash made only of decimal digits that reads as a
// PID is indistinguishable from a control socket kc-<pid>.sock; it is
// parsed as one, and gate 3 keeps the ambiguity safe: an answer whose
// process_id is not the name's makes the socket unknown, never stale. It is stale only when gates 2 and 3
// both find it dead and its inode changed at least a minimum age ago
// (Config.HashedMinAge): without an owner's start time, the age is a
// second line of defence behind net/unix against calling a fresh socket,
// bound but not yet listening, dead. Anything that listens on it, is
// bound to its path or answers /status makes it live.
//
// Unlinking happens relative to an open directory descriptor, never
// following symlinks, and only if the entry is still a socket with the
// same device, inode and owner as when it was classified (sockets.UnlinkAt).
package sweep
