package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// The Responses API request as the simulator reads it (responses.go serves
// it): decoding, input items to chat messages, tools to chat form.

// responsesRequest is the body of POST /v1/responses. Fields the simulator
// does not use are still type-checked where vLLM's pydantic model would
// reject them, and echoed in the response where OpenAI's object has them.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             openai.Bool     `json:"stream"`
	Store              *bool           `json:"store"`
	Background         *bool           `json:"background"`
	PreviousResponseID *string         `json:"previous_response_id"`
	RequestID          *string         `json:"request_id"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	MaxToolCalls       *int            `json:"max_tool_calls"`
	Metadata           json.RawMessage `json:"metadata"`
	Reasoning          json.RawMessage `json:"reasoning"`
	Text               json.RawMessage `json:"text"`
	Prompt             json.RawMessage `json:"prompt"`
	User               *string         `json:"user"`
	ServiceTier        *string         `json:"service_tier"`
	Truncation         *string         `json:"truncation"`
	// vLLM's extras.
	IgnoreEOS bool    `json:"ignore_eos"`
	CacheSalt *string `json:"cache_salt"`

	// set by decodeResponsesRequest
	input     []respMessage   // the input items as chat messages
	chatTools json.RawMessage // function tools in the chat form, for the template
}

// respMessage is one chat message as vLLM builds it from an input item; it
// marshals to the chat form the template renders.
type respMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"` // a string, null, or [{"type":"text","text":…}]
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID *string         `json:"tool_call_id,omitempty"`
	text       string          // the content's text (parts concatenated), for flat templates
}

func (m *respMessage) chatMessage() openai.ChatMessage {
	c := openai.Content{Text: m.text}
	switch {
	case len(m.Content) == 0 || string(m.Content) == "null":
		c.Null = true
	case m.Content[0] == '[':
		c.Parts = []openai.ContentPart{}
		if m.text != "" {
			c.Parts = append(c.Parts, openai.ContentPart{Type: "text", Text: m.text})
		}
	}
	return openai.ChatMessage{Role: m.Role, Content: c}
}

func textMessage(role, text string) respMessage {
	return respMessage{Role: role, Content: openai.AppendString(nil, text), text: text}
}

// decodeResponsesRequest decodes and checks a Responses body; every problem
// is a 400 naming the field.
func decodeResponsesRequest(body []byte) (*responsesRequest, error) {
	var r responsesRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) { // its text names Go types
			field := ""
			if te.Field != "" {
				field = te.Field + ": "
			}
			return nil, badRequest("decode body: %sexpected %s, got %s", field, openai.JSONKind(te.Type), te.Value)
		}
		return nil, badRequest("decode body: %v", err)
	}
	if openai.TrailingData(dec) {
		return nil, badRequest("decode body: trailing data after the JSON object")
	}
	var problems []string
	if r.MaxOutputTokens != nil && *r.MaxOutputTokens < 1 {
		problems = append(problems, fmt.Sprintf("max_output_tokens %d: must be at least 1", *r.MaxOutputTokens))
	}
	if r.Temperature != nil && *r.Temperature < 0 {
		problems = append(problems, "temperature: must not be negative")
	}
	if r.TopP != nil && (*r.TopP <= 0 || *r.TopP > 1) {
		problems = append(problems, "top_p: must be in (0, 1]")
	}
	if r.RequestID != nil && *r.RequestID == "" {
		problems = append(problems, "request_id: must not be empty")
	}
	if r.CacheSalt != nil && *r.CacheSalt == "" {
		problems = append(problems, "cache_salt: must be a non-empty string")
	}
	if !isJSONNull(r.Prompt) {
		problems = append(problems, "prompt: prompt template is not supported") // vLLM's refusal
	}
	if r.Truncation != nil && *r.Truncation != "auto" && *r.Truncation != "disabled" {
		problems = append(problems, fmt.Sprintf("truncation %q: want auto or disabled", *r.Truncation))
	}
	if isTrue(r.Background) && r.Store != nil && !*r.Store {
		problems = append(problems, "background can only be used when `store` is true")
	}
	if !isJSONNull(r.Metadata) && r.Metadata[0] != '{' {
		problems = append(problems, "metadata: must be an object")
	}
	if len(problems) > 0 {
		return nil, badRequest("%s", strings.Join(problems, "; "))
	}
	var err error
	if r.input, err = inputMessages(r.Input); err != nil {
		return nil, err
	}
	if r.chatTools, err = chatTools(r.Tools); err != nil {
		return nil, err
	}
	return &r, nil
}

// inputMessages converts input (a string, or an array of input items) into
// the chat messages vLLM renders: a string is one user message; an item
// with a role (type "message" or none) is that message, its text parts
// (input_text, output_text, text) kept as text parts and its input_image
// parts as they are; a function_call is an
// assistant message with one tool call; a function_call_output is a tool
// message; a reasoning item adds nothing.
func inputMessages(input json.RawMessage) ([]respMessage, error) {
	if isJSONNull(input) {
		return nil, badRequest("input: required")
	}
	switch input[0] {
	case '"':
		var s string
		if err := json.Unmarshal(input, &s); err != nil {
			return nil, badRequest("input: %v", err)
		}
		return []respMessage{textMessage("user", s)}, nil
	case '[':
	default:
		return nil, badRequest("input: must be a string or an array of input items")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, badRequest("input: %v", err)
	}
	msgs := make([]respMessage, 0, len(items))
	for i, raw := range items {
		m, ok, err := inputItem(raw, i)
		if err != nil {
			return nil, err
		}
		if ok {
			msgs = append(msgs, m)
		}
	}
	return msgs, nil
}

// inputItem converts input item i; ok is false for an item that adds no
// message (reasoning).
func inputItem(raw json.RawMessage, i int) (_ respMessage, ok bool, _ error) {
	if len(raw) == 0 || raw[0] != '{' {
		return respMessage{}, false, badRequest("input[%d]: must be an object", i)
	}
	var it struct {
		Type      json.RawMessage `json:"type"`
		Role      json.RawMessage `json:"role"`
		Content   json.RawMessage `json:"content"`
		CallID    json.RawMessage `json:"call_id"`
		Name      json.RawMessage `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Output    json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &it); err != nil {
		return respMessage{}, false, badRequest("input[%d]: %v", i, err)
	}
	typ, typOK := jsonString(it.Type)
	if !isJSONNull(it.Type) && !typOK {
		return respMessage{}, false, badRequest("input[%d].type: must be a string", i)
	}
	switch typ {
	case "function_call":
		callID, ok1 := jsonString(it.CallID)
		name, ok2 := jsonString(it.Name)
		args, ok3 := jsonString(it.Arguments)
		if !ok1 || !ok2 || !ok3 {
			return respMessage{}, false, badRequest("input[%d]: a function_call needs string call_id, name and arguments", i)
		}
		type fn struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}
		type toolCall struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function fn     `json:"function"`
		}
		tc, err := json.Marshal([]toolCall{{ID: callID, Type: "function", Function: fn{Name: name, Arguments: args}}})
		if err != nil {
			return respMessage{}, false, badRequest("input[%d]: %v", i, err)
		}
		return respMessage{Role: "assistant", Content: json.RawMessage("null"), ToolCalls: tc}, true, nil
	case "function_call_output":
		callID, ok1 := jsonString(it.CallID)
		out, ok2 := jsonString(it.Output)
		if !ok1 || !ok2 {
			return respMessage{}, false, badRequest("input[%d]: a function_call_output needs string call_id and output", i)
		}
		m := textMessage("tool", out)
		m.ToolCallID = &callID
		return m, true, nil
	case "reasoning":
		return respMessage{}, false, nil
	case "", "message":
	default:
		return respMessage{}, false, badRequest("input[%d].type %q is not supported", i, typ)
	}
	role, ok := jsonString(it.Role)
	if !ok {
		return respMessage{}, false, badRequest("input[%d].role: required (a string)", i)
	}
	switch role {
	case "user", "assistant", "system", "developer":
	default:
		return respMessage{}, false, badRequest("input[%d].role %q: want user, assistant, system or developer", i, role)
	}
	m := respMessage{Role: role}
	switch {
	case isJSONNull(it.Content):
		m.Content = json.RawMessage("null")
	case it.Content[0] == '"':
		if err := json.Unmarshal(it.Content, &m.text); err != nil {
			return respMessage{}, false, badRequest("input[%d].content: %v", i, err)
		}
		m.Content = it.Content
	case it.Content[0] == '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(it.Content, &parts); err != nil {
			return respMessage{}, false, badRequest("input[%d].content: %v", i, err)
		}
		type textPart struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		kept := []any{}
		for j, p := range parts {
			if len(p) == 0 || p[0] != '{' {
				return respMessage{}, false, badRequest("input[%d].content[%d]: must be an object", i, j)
			}
			var part struct {
				Type json.RawMessage `json:"type"`
				Text json.RawMessage `json:"text"`
			}
			if err := json.Unmarshal(p, &part); err != nil {
				return respMessage{}, false, badRequest("input[%d].content[%d]: %v", i, j, err)
			}
			switch pt, _ := jsonString(part.Type); pt {
			case "input_text", "output_text", "text":
				text, ok := jsonString(part.Text)
				if !ok {
					return respMessage{}, false, badRequest("input[%d].content[%d]: a text part needs a string text", i, j)
				}
				kept = append(kept, textPart{Type: "text", Text: text})
				m.text += text
			case "input_image":
				kept = append(kept, p) // vLLM hands it to the chat parser as it is
			}
			// Other parts (files, refusals) carry no text for the template
			// and are left out.
		}
		b, err := json.Marshal(kept)
		if err != nil {
			return respMessage{}, false, badRequest("input[%d].content: %v", i, err)
		}
		m.Content = b
	default:
		return respMessage{}, false, badRequest("input[%d].content: must be a string or an array of content parts", i)
	}
	return m, true, nil
}

// chatTools converts the Responses function tools ({type, name,
// description, parameters}) into the chat form the template takes
// ({type, function: {…}}); other tool types are left out.
func chatTools(tools json.RawMessage) (json.RawMessage, error) {
	if isJSONNull(tools) {
		return nil, nil
	}
	if tools[0] != '[' {
		return nil, badRequest("tools: must be an array")
	}
	var list []json.RawMessage
	if err := json.Unmarshal(tools, &list); err != nil {
		return nil, badRequest("tools: %v", err)
	}
	type function struct {
		Name        string          `json:"name"`
		Description *string         `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	type chatTool struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	out := []chatTool{}
	for i, raw := range list {
		if len(raw) == 0 || raw[0] != '{' {
			return nil, badRequest("tools[%d]: must be an object", i)
		}
		var t struct {
			Type        json.RawMessage `json:"type"`
			Name        json.RawMessage `json:"name"`
			Description json.RawMessage `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, badRequest("tools[%d]: %v", i, err)
		}
		typ, _ := jsonString(t.Type)
		name, ok := jsonString(t.Name)
		if typ != "function" || !ok {
			continue
		}
		f := function{Name: name}
		if d, ok := jsonString(t.Description); ok {
			f.Description = &d
		}
		if len(t.Parameters) > 0 && t.Parameters[0] == '{' {
			f.Parameters = t.Parameters
		}
		out = append(out, chatTool{Type: "function", Function: f})
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, badRequest("tools: %v", err)
	}
	return b, nil
}

func isJSONNull(v json.RawMessage) bool {
	return len(v) == 0 || string(v) == "null"
}

// jsonString unquotes v when it is a JSON string.
func jsonString(v json.RawMessage) (string, bool) {
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}
