package scaler

import (
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
	seen    map[time.Duration]time.Time // window → last evaluation asking for it
	current time.Duration
	floor   time.Duration
	checked time.Time // when windows not asked for were last let go
	set     func(time.Duration)
}

// windowForget is how long a window no evaluation asks for is kept.
const windowForget = 5 * time.Minute

// newWindows starts at floor and sets it.
func newWindows(floor time.Duration, set func(time.Duration)) *windows {
	set(floor)
	return &windows{seen: map[time.Duration]time.Time{}, current: floor, floor: floor, set: set}
}

// note records an evaluation asking for window d at now.
func (w *windows) note(d time.Duration, now time.Time) {
	if w == nil {
		return
	}
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
