package supervise

import (
	"os"
	"testing"
)

// TestDocumentedExampleParses keeps the README's and docs' allowlist
// example valid.
func TestDocumentedExampleParses(t *testing.T) {
	data, err := os.ReadFile("../../docs/supervisors.example.json")
	if err != nil {
		t.Fatal(err)
	}
	al, err := ParseAllowlist(data)
	if err != nil {
		t.Fatalf("docs/supervisors.example.json: %v", err)
	}
	if al == nil {
		t.Fatal("nil allowlist")
	}
}
