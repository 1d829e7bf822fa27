package autoscale

import "time"

// Reconfigure replaces the policy of a running autoscaler (an edited
// AutoscalingPolicy) and keeps what it learnt: every role the new policy
// still scales keeps its samples (the next step reads them through the new
// windows), its panic and its last scale-up (the cool-down holds), and the
// SLO mode keeps its memory; a new role starts empty, a dropped one is
// forgotten. An invalid policy changes nothing.
func (a *Autoscaler) Reconfigure(p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	roles := make(map[string]*roleState, len(p.Roles))
	for n := range p.Roles {
		if st := a.roles[n]; st != nil {
			roles[n] = st
		} else {
			roles[n] = &roleState{}
		}
	}
	a.p, a.roles = p, roles
	return nil
}

// SeedLastScale tells a new autoscaler, at now, when its roles were last
// scaled (a restarted controller or a new leader reads it from the
// policy's status.lastScaleTime): it counts as each role's last scale-up,
// so the scale-down cool-down holds across a restart instead of starting
// from nothing. A later scale-up the autoscaler saw itself is kept. A time
// after now counts as now: it was written on another clock (a leader whose
// clock was ahead), and taken as is it would hold the cool-down for the
// skew too.
func (a *Autoscaler) SeedLastScale(t, now time.Time) {
	if t.After(now) {
		t = now
	}
	for _, st := range a.roles {
		if st.lastUp.Before(t) {
			st.lastUp = t
		}
	}
}
