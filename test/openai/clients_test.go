package openai

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
)

// Pinned releases of the other clients.
const (
	aiSDKVersion       = "6.0.333"
	aiSDKOpenAIVersion = "3.0.141"
	langchainVersion   = "1.5.8"
)

// TestOtherNodeClients drives the ingress with the Vercel AI SDK (its
// default OpenAI model speaks the Responses API; also its chat and
// completion models) and LangChain's ChatOpenAI (chat, streamed with usage,
// and its Responses mode), as their users call them: every call must give
// text and the token counts the engine reports.
func TestOtherNodeClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	work := nodeWork(t, "clients-"+aiSDKVersion+"-"+aiSDKOpenAIVersion+"-"+langchainVersion,
		"the test drives the ingress with the AI SDK and LangChain",
		[]string{"ai@" + aiSDKVersion, "@ai-sdk/openai@" + aiSDKOpenAIVersion, "@langchain/openai@" + langchainVersion}, "clients.mjs")
	const model = "e2e-model"
	cfg := ingress.DefaultConfig()
	cfg.Engines = startEngines(t, ctx, 2, model, nil)
	srv := startIngress(t, ctx, cfg, ingress.Deps{})
	var res map[string]map[string]any
	runScript(t, ctx, "node", work, "clients.mjs", &res, "KVMESH_BASE_URL=http://"+srv.Addr()+"/v1", "KVMESH_API_KEY=unused", "KVMESH_MODEL="+model)
	for name, want := range map[string]int{
		"aisdk_responses": 8, "aisdk_responses_stream": 6, "aisdk_chat": 7, "aisdk_chat_stream": 5, "aisdk_completion": 4,
		"langchain_chat": 7, "langchain_stream": 5, "langchain_responses": 6,
	} {
		r := res[name]
		t.Logf("%s: %v", name, r)
		u, _ := r["usage"].(map[string]any)
		if r == nil || r["error"] == true || r["text"] == "" || num(u["output"]) != want || num(u["input"]) <= 0 {
			t.Errorf("%s: %v (want text, %d output tokens and the prompt's count)", name, r, want)
		}
	}
}
