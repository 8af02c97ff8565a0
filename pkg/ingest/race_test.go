//go:build race

package ingest

// raceEnabled: the race detector makes sync.Pool drop a quarter of what is
// put back, so allocation counts through a pool vary.
const raceEnabled = true
