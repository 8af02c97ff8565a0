//go:build suite

package bench

import (
	"io"
	"strings"
	"testing"
)

// TestShippedSuiteClairvoyantBounds runs the shipped suite
// (docs/simulation/suite.yaml, every seed, every clairvoyant plan also
// held 15 minutes and an hour, and the switches; about 4 minutes on 2 cores: make
// sim-suite) and checks that the clairvoyant frontier bounds every
// signal pipeline of every case at its GPU-hours after the warm-up, and
// that every case scored what it should.
func TestShippedSuiteClairvoyantBounds(t *testing.T) {
	s, err := Read("../../../docs/simulation/suite.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sb, _, err := s.Run("docs/simulation/suite.yaml", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.AboveClairvoyant) > 0 {
		t.Fatalf("above the clairvoyant frontier: %s", strings.Join(sb.AboveClairvoyant, "; "))
	}
	want := len(s.Traces) * len(s.Profiles) * len(s.ScaledObjects)
	if len(sb.Cases) != want {
		t.Fatalf("%d cases, want %d", len(sb.Cases), want)
	}
	for _, c := range sb.Cases {
		if len(c.Pipelines) == 0 || len(c.Static) == 0 || len(c.ClairvoyantFrontier) == 0 {
			t.Fatalf("%s: %d pipelines, %d static, frontier %v", caseName(c), len(c.Pipelines), len(c.Static), c.ClairvoyantFrontier)
		}
		for _, sc := range c.Pipelines {
			if sc.ToClairvoyant == nil {
				t.Errorf("%s: %s used fewer GPU-hours than any clairvoyant point", caseName(c), sc.Pipeline)
			}
		}
	}
}
