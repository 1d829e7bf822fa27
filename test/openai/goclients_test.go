package openai

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	oaiopt "github.com/openai/openai-go/v3/option"
	oairesp "github.com/openai/openai-go/v3/responses"
	gooai "github.com/sashabaranov/go-openai"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/sim"
)

// startGoClientMesh is two simulated engines (keeping stored responses, as
// vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1) behind an ingress; it returns
// the ingress's /v1 base URL.
func startGoClientMesh(t *testing.T, ctx context.Context, model string) string {
	t.Helper()
	cfg := ingress.DefaultConfig()
	cfg.Engines = startEngines(t, ctx, 2, model, func(c *sim.Config) { c.ResponsesStore = true })
	srv := startIngress(t, ctx, cfg, ingress.Deps{})
	return "http://" + srv.Addr() + "/v1"
}

// TestOpenAIGoClient drives the ingress with OpenAI's official Go SDK
// (github.com/openai/openai-go), an independent decoder of every answer:
// models, a chat and its stream (through the SDK's accumulator), n = 2, a
// completion, a stored response and its follow-up, and an unknown model as
// the SDK's typed error.
func TestOpenAIGoClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const model = "go-model"
	base := startGoClientMesh(t, ctx, model)
	c := oai.NewClient(oaiopt.WithBaseURL(base+"/"), oaiopt.WithAPIKey("unused"), oaiopt.WithMaxRetries(0))

	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) == 0 || models.Data[0].ID != model {
		t.Fatalf("models: %+v %v", models, err)
	}
	msgs := []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("You are terse."), oai.UserMessage("Say hello.")}
	chat, err := c.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxCompletionTokens: oai.Int(7)})
	if err != nil || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" || chat.Usage.CompletionTokens != 7 || chat.Choices[0].FinishReason != "length" {
		t.Fatalf("chat: %+v %v", chat, err)
	}

	stream := c.Chat.Completions.NewStreaming(ctx, oai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxCompletionTokens: oai.Int(7),
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}})
	var acc oai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("chunk %d does not add up: %s", chunks, stream.Current().RawJSON())
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	stream.Close()
	if chunks < 3 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != chat.Choices[0].Message.Content || acc.Usage.CompletionTokens != 7 {
		t.Errorf("stream: %d chunks, accumulated %+v; want the non-streamed answer %q and 7 tokens", chunks, acc.ChatCompletion, chat.Choices[0].Message.Content)
	}

	two, err := c.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: model, Messages: msgs, MaxCompletionTokens: oai.Int(4), N: oai.Int(2)})
	if err != nil || len(two.Choices) != 2 || two.Choices[1].Index != 1 || two.Usage.CompletionTokens != 8 || two.Usage.PromptTokens != chat.Usage.PromptTokens {
		t.Errorf("n 2: %+v %v", two, err)
	}

	comp, err := c.Completions.New(ctx, oai.CompletionNewParams{Model: oai.CompletionNewParamsModel(model),
		Prompt: oai.CompletionNewParamsPromptUnion{OfString: oai.String("The quick brown fox")}, MaxTokens: oai.Int(5)})
	if err != nil || len(comp.Choices) != 1 || comp.Choices[0].Text == "" || comp.Usage.CompletionTokens != 5 {
		t.Errorf("completion: %+v %v", comp, err)
	}

	// The Responses API: a stored response, then a turn that follows it
	// (the ingress sends it to the engine holding the first).
	r1, err := c.Responses.New(ctx, oairesp.ResponseNewParams{Model: model, Input: oairesp.ResponseNewParamsInputUnion{OfString: oai.String("Say hello.")},
		MaxOutputTokens: oai.Int(6), Store: oai.Bool(true)})
	if err != nil || r1.ID == "" || r1.OutputText() == "" || r1.Usage.OutputTokens != 6 {
		t.Fatalf("responses: %+v %v", r1, err)
	}
	r2, err := c.Responses.New(ctx, oairesp.ResponseNewParams{Model: model, Input: oairesp.ResponseNewParamsInputUnion{OfString: oai.String("Again.")},
		MaxOutputTokens: oai.Int(3), PreviousResponseID: oai.String(r1.ID)})
	if err != nil || r2.OutputText() == "" || r2.Usage.InputTokens <= r1.Usage.InputTokens+r1.Usage.OutputTokens {
		t.Errorf("follow-up: %+v %v (want input counting the first turn, %d + %d tokens)", r2, err, r1.Usage.InputTokens, r1.Usage.OutputTokens)
	}

	_, err = c.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: "no-such-model", Messages: msgs, MaxCompletionTokens: oai.Int(1)})
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Message == "" || apiErr.Type == "" {
		t.Errorf("unknown model: %v (want the SDK's 404 error with the OpenAI error body)", err)
	}
}

// TestGoOpenAIClient drives the ingress with github.com/sashabaranov/go-openai,
// the community Go client many Go services use: a chat and its stream with
// usage, n = 2, a completion, models, and an unknown model as its APIError.
func TestGoOpenAIClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const model = "go-model"
	cfg := gooai.DefaultConfig("unused")
	cfg.BaseURL = startGoClientMesh(t, ctx, model)
	c := gooai.NewClientWithConfig(cfg)

	models, err := c.ListModels(ctx)
	if err != nil || len(models.Models) == 0 || models.Models[0].ID != model {
		t.Fatalf("models: %+v %v", models, err)
	}
	msgs := []gooai.ChatCompletionMessage{{Role: gooai.ChatMessageRoleSystem, Content: "You are terse."}, {Role: gooai.ChatMessageRoleUser, Content: "Say hello."}}
	chat, err := c.CreateChatCompletion(ctx, gooai.ChatCompletionRequest{Model: model, Messages: msgs, MaxCompletionTokens: 7})
	if err != nil || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" || chat.Usage.CompletionTokens != 7 || chat.Choices[0].FinishReason != gooai.FinishReasonLength {
		t.Fatalf("chat: %+v %v", chat, err)
	}

	stream, err := c.CreateChatCompletionStream(ctx, gooai.ChatCompletionRequest{Model: model, Messages: msgs, MaxCompletionTokens: 7, Stream: true,
		StreamOptions: &gooai.StreamOptions{IncludeUsage: true}})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	var usage *gooai.Usage
	finish := gooai.FinishReason("")
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if r.Usage != nil {
			usage = r.Usage
		}
		for _, ch := range r.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	stream.Close()
	if text.String() != chat.Choices[0].Message.Content || usage == nil || usage.CompletionTokens != 7 || finish != gooai.FinishReasonLength {
		t.Errorf("stream: %q, usage %+v, finish %q; want the non-streamed %q, 7 tokens, length", text.String(), usage, finish, chat.Choices[0].Message.Content)
	}

	two, err := c.CreateChatCompletion(ctx, gooai.ChatCompletionRequest{Model: model, Messages: msgs, MaxCompletionTokens: 4, N: 2})
	if err != nil || len(two.Choices) != 2 || two.Choices[1].Index != 1 || two.Usage.CompletionTokens != 8 {
		t.Errorf("n 2: %+v %v", two, err)
	}

	comp, err := c.CreateCompletion(ctx, gooai.CompletionRequest{Model: model, Prompt: "The quick brown fox", MaxTokens: 5})
	if err != nil || len(comp.Choices) != 1 || comp.Choices[0].Text == "" || comp.Usage.CompletionTokens != 5 {
		t.Errorf("completion: %+v %v", comp, err)
	}

	_, err = c.CreateChatCompletion(ctx, gooai.ChatCompletionRequest{Model: "no-such-model", Messages: msgs, MaxCompletionTokens: 1})
	var apiErr *gooai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusNotFound || apiErr.Message == "" || apiErr.Type == "" {
		t.Errorf("unknown model: %v (want go-openai's APIError, 404, with the OpenAI error body)", err)
	}
}
