package ledger

import (
	"reflect"
	"testing"

	"github.com/kc-watchman/kc-watchman/internal/trees"
)

func TestKnownFromSkipsGroupsThatWereNotTheContainers(t *testing.T) {
	cidA, cidB := id(1), id(2)
	recs := []*Record{{
		ContainerID: cidA,
		BootID:      "boot",
		Trees: []Tree{
			{PGID: 10, Members: []Process{{PID: 10, StartTicks: 1}}, Action: "reaped"},
			{PGID: 20, Members: []Process{{PID: 20, StartTicks: 2}}, Action: "skipped-ambiguous"},
			{PGID: 30, Members: []Process{{PID: 30, StartTicks: 3}}, Action: "skipped-foreign"},
			{PGID: 40, Members: []Process{{PID: 40, StartTicks: 4}}},
		},
	}, {
		ContainerID: cidB,
		BootID:      "another boot",
		Trees:       []Tree{{PGID: 50, Members: []Process{{PID: 50, StartTicks: 5}}}},
	}}
	got := KnownFrom(recs, "boot")
	want := map[trees.Key]string{{PID: 10, StartTicks: 1, PGID: 10}: cidA, {PID: 40, StartTicks: 4, PGID: 40}: cidA}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("KnownFrom = %v, want %v", got, want)
	}
}
