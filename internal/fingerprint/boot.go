package fingerprint

import (
	"fmt"
	"os"
	"strings"
)

// BootID reads the kernel's boot ID. Start times count from boot: an
// identity, a record or a cached layout from another boot means nothing.
func BootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("reading boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
