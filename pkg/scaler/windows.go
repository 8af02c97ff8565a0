package scaler

import (
	"math"
	"sync"
	"time"
)

// windows follows the windows the live triggers ask for and keeps the
// store's retention at the longest of them, so that the store holds what
// is read and no more (docs/performance.md, "The store's memory"). A
// trigger is live while it is evaluated: KEDA's push stream re-evaluates
// every recheck, the HPA polls every 15 s. A longer window takes effect
// at once (the store keeps more from then on: a new trigger's first
// windows are short, as after a restart); a window no trigger has asked
// for in windowForget is let go.
type windows struct {
	mu      sync.Mutex
	seen    map[time.Duration]time.Time // window (windowKey) → last evaluation asking for it
	current time.Duration
	floor   time.Duration
	most    time.Duration // --max-window (0: none)
	checked time.Time     // when windows not asked for were last let go
	set     func(time.Duration)
}

// windowForget is how long a window no evaluation asks for is kept.
const windowForget = 5 * time.Minute

// newWindows starts at floor and sets it; most is the longest window a
// trigger may ask for (0: no bound).
func newWindows(floor, most time.Duration, set func(time.Duration)) *windows {
	set(floor)
	return &windows{seen: map[time.Duration]time.Time{}, current: floor, floor: floor, most: most, set: set}
}

// windowKey is the window d is followed as: d rounded up to a step, the
// least power of two seconds at least a 64th of it (whole seconds to
// 64 s; 2 s to 128 s; …), so under a 32nd of it; at most most, or d
// itself past it. The store keeps less than 3.1 % more than asked for,
// and a caller naming a new window each call (any duration to the
// nanosecond is a valid window) holds at most 64 keys an octave: the map
// was keyed by the window itself, one entry a call for windowForget,
// walked under the lock every evaluation takes (200,000 calls held
// 200,000 windows).
func windowKey(d, most time.Duration) time.Duration {
	if most > 0 && d >= most {
		return d // past the most: as asked
	}
	step := time.Second
	for step < d/64 {
		step *= 2
	}
	k := d / step * step
	if k == d || k > math.MaxInt64-step {
		return d // on a step, or within one of the longest duration
	}
	if k += step; most > 0 {
		k = min(k, most)
	}
	return k
}

// note records an evaluation asking for window d at now.
func (w *windows) note(d time.Duration, now time.Time) {
	if w == nil {
		return
	}
	d = windowKey(d, w.most)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen[d] = now
	if d > w.current {
		w.current = d
		w.set(d)
		return
	}
	if now.Sub(w.checked) < windowForget/30 {
		return
	}
	w.checked = now
	longest := w.floor
	for win, at := range w.seen {
		if now.Sub(at) > windowForget {
			delete(w.seen, win)
			continue
		}
		longest = max(longest, win)
	}
	if longest < w.current {
		w.current = longest
		w.set(longest)
	}
}
