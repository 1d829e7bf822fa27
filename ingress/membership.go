package ingress

import (
	"strings"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/scheduler"
)

// staticMembership serves Config.Engines as always-healthy engines.
type staticMembership struct{ engines []EngineInfo }

var _ Membership = (*staticMembership)(nil)

func newStaticMembership(list []StaticEngine) *staticMembership {
	m := &staticMembership{}
	for _, e := range list {
		role, _ := scheduler.ParseRole(e.Role) // Validate rejected bad roles
		pdp := ""
		if e.PDProtocol == "sglang" {
			pdp = gossip.PDProtocolSGLang
		}
		m.engines = append(m.engines, EngineInfo{Engine: scheduler.Engine{ID: e.ID, Model: e.Model, Healthy: true, Role: role, Group: e.Group, PDProtocol: pdp},
			URL: strings.TrimSuffix(e.URL, "/"), Bootstrap: e.Bootstrap})
	}
	return m
}

func (m *staticMembership) Engines(dst []EngineInfo) []EngineInfo { return append(dst, m.engines...) }
