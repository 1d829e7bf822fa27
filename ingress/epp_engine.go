package ingress

// AuthOn reports whether client authentication is on (--api-keys-file,
// --jwks-*): a calling proxy then keeps the client's credentials from the
// engines, as the ingress does (docs/SECURITY.md).
func (s *Server) AuthOn() bool { return s.deps.Auth != nil }

// EngineAuthorization is the Authorization value the ingress sends the
// engines ("Bearer " + Config.EngineAPIKey, $KVMESH_ENGINE_API_KEY), ""
// without an engine key.
func (s *Server) EngineAuthorization() string { return string(s.engineAuth) }
