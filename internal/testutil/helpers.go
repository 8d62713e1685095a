package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

// PathExists reports whether p names anything, a dangling symlink
// included (Lstat, never following it).
func PathExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// RandomHex returns digits random lowercase hex digits (64: a container
// ID no engine has).
func RandomHex(t testing.TB, digits int) string {
	t.Helper()
	b := make([]byte, (digits+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:digits]
}
