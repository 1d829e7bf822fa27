package materialize

import "time"

// TickAt runs one housekeeping pass as if the clock read now, so tests
// decide what time the checks see (Run's own ticker: Config.CheckInterval).
func (m *Materializer) TickAt(now time.Time) { m.tick(now) }
