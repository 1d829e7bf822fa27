package ingress

import (
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// An engine started with an API key (vLLM's and SGLang's --api-key) answers
// 401 to a request without it. The ingress never forwards the client's own
// credential (docs/SECURITY.md), so such a 401 is about the ingress's
// engine key (engineAPIKey, $KVMESH_ENGINE_API_KEY), missing or another:
// relayed, it would tell the client its own key is wrong. It is an
// attempt failure instead (result credential_refused): the next engine is
// tried (another may take the key), the operator is warned, and when no
// engine answered the client gets 503 ingress_engine_credential_refused.
// The engine is not ejected: its health probe needs no key, so ejection
// would only cycle, and the 401 costs one round trip.

// credentialLogEvery bounds the warnings of engines refusing the key.
const credentialLogEvery = 10 * time.Second

// credentialRefused ends an attempt the engine answered 401.
func (c *call) credentialRefused(up *upstream, resp *fasthttp.Response) error {
	return c.attemptFailed(up, resp, "credential_refused", c.s.credentialError(up, resp))
}

// credentialError is what an engine's 401 to this ingress means, warned
// of at most once per credentialLogEvery. A P/D leg refused so falls back
// as after any other failed leg (fallback_credential_refused).
func (s *Server) credentialError(up *upstream, resp *fasthttp.Response) error {
	says := engineSays(resp)
	var err error
	if len(s.engineAuth) == 0 {
		err = errors.New("answered 401: it wants an API key and this ingress sends none (set engineAPIKey or $KVMESH_ENGINE_API_KEY to the engines' --api-key)" + says)
	} else {
		err = errors.New("answered 401: it does not take this ingress's engine key (engineAPIKey or $KVMESH_ENGINE_API_KEY; the engines' --api-key)" + says)
	}
	u := s.ups
	if now, last := monotime.Now(), u.authLastLog.Load(); u.log != nil && (last == 0 || now-last >= int64(credentialLogEvery)) && u.authLastLog.CompareAndSwap(last, now) {
		u.log.Warn("an engine refused this ingress's engine credential; clients get 503 ingress_engine_credential_refused where no engine takes it (later refusals within 10s are only counted: kvmesh_ingress_upstream_attempts_total{result=\"credential_refused\"}, P/D prefill legs in kvmesh_ingress_pd_legs_total{result=~\".*credential_refused\"})",
			"engine", up.id, "err", fmt.Sprint(err))
	}
	return err
}
