package sim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// The Anthropic Messages request as the simulator reads it (messages.go
// serves it): decoding with the checks vLLM's pydantic models make
// (vllm/entrypoints/anthropic/protocol.py), and the conversion into the chat
// completions request vLLM renders (AnthropicServingMessages.
// _convert_anthropic_to_openai_request in vllm/entrypoints/anthropic/
// serving.py).

// anthropicPrompt is the part of a Messages request that decides the
// prompt; it is the whole of a count_tokens request
// (AnthropicCountTokensRequest). Other fields a count_tokens body carries
// are ignored, as vLLM ignores them.
type anthropicPrompt struct {
	Model              string            `json:"model"` // "" (absent or null): the served model
	Messages           []json.RawMessage `json:"messages"`
	System             json.RawMessage   `json:"system"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []json.RawMessage `json:"tools"`
	ChatTemplateKwargs json.RawMessage   `json:"chat_template_kwargs"`

	// set by convert
	chat      []chatMessage   // the chat messages vLLM renders
	chatTools json.RawMessage // the tools in the chat form, nil without tools
}

// messagesRequest is the body of POST /v1/messages
// (AnthropicMessagesRequest). Fields the simulator does not use are still
// type-checked as vLLM's model checks them.
type messagesRequest struct {
	anthropicPrompt
	MaxTokens        *int            `json:"max_tokens"`
	Metadata         json.RawMessage `json:"metadata"`
	OutputConfig     json.RawMessage `json:"output_config"`
	StopSequences    []string        `json:"stop_sequences"` // vLLM's stop (reported as end_turn, as vLLM does)
	Stream           openai.Bool     `json:"stream"`
	Temperature      *float64        `json:"temperature"`
	TopK             *int            `json:"top_k"`
	TopP             *float64        `json:"top_p"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"` // read again by decodePD
	CacheSalt        *string         `json:"cache_salt"`         // newer vLLM's extra
}

// chatMessage is one chat message as vLLM builds it from the Anthropic
// messages; it marshals with vLLM's keys in vLLM's order.
type chatMessage struct {
	Role       string          `json:"role"`
	ToolCallID *string         `json:"tool_call_id,omitempty"`
	Reasoning  *string         `json:"reasoning,omitempty"`
	ToolCalls  []chatToolCall  `json:"tool_calls,omitempty"`
	Content    json.RawMessage `json:"content,omitempty"` // a string or a list of parts; absent when vLLM sets none
}

// chatPart is a content part: text, image_url or tool_reference.
type chatPart struct {
	Type     string          `json:"type"`
	Text     *string         `json:"text,omitempty"`
	ImageURL *chatImageURL   `json:"image_url,omitempty"`
	Name     json.RawMessage `json:"name,omitempty"` // tool_reference
}

type chatImageURL struct {
	URL string `json:"url"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"` // Python's json.dumps of the tool_use input
}

// contentBlock is an Anthropic content block (AnthropicContentBlock).
type contentBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Source    json.RawMessage `json:"source"` // object or null
	ID        *string         `json:"id"`
	ToolUseID *string         `json:"tool_use_id"`
	Name      *string         `json:"name"`
	Input     json.RawMessage `json:"input"`   // object or null
	Content   json.RawMessage `json:"content"` // string, list of objects, or null
	IsError   *bool           `json:"is_error"`
	ToolName  *string         `json:"tool_name"`
	Thinking  *string         `json:"thinking"`
	Signature *string         `json:"signature"`
	Data      *string         `json:"data"`
}

// blockTypes are the block types vLLM accepts.
var blockTypes = map[string]bool{"text": true, "image": true, "tool_use": true, "tool_result": true,
	"tool_reference": true, "thinking": true, "redacted_thinking": true}

// anthropicMessage is one decoded message: its role and either a string
// content (text) or blocks.
type anthropicMessage struct {
	role   string
	text   *string
	blocks []contentBlock
}

// billingHeader starts Claude Code's per-request attribution text, which
// vLLM drops from system blocks (it would defeat prefix caching).
const billingHeader = "x-anthropic-billing-header"

// decodeMessagesRequest decodes and checks a POST /v1/messages body and
// converts it to chat messages; every problem is a 400 naming the field.
func decodeMessagesRequest(body []byte) (*messagesRequest, error) {
	var r messagesRequest
	if err := decodeBody(body, &r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	if err := r.convert(); err != nil {
		return nil, err
	}
	return &r, nil
}

// decodeCountTokensRequest decodes a POST /v1/messages/count_tokens body
// and converts it as decodeMessagesRequest does.
func decodeCountTokensRequest(body []byte) (*anthropicPrompt, error) {
	var p anthropicPrompt
	if err := decodeBody(body, &p); err != nil {
		return nil, err
	}
	if err := p.convert(); err != nil {
		return nil, err
	}
	return &p, nil
}

// decodeBody decodes one JSON object; a type error names the field and
// the JSON kinds, never Go types.
func decodeBody(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return typeError("", err)
	}
	if openai.TrailingData(dec) {
		return badRequest("decode body: trailing data after the JSON object")
	}
	return nil
}

// decodeAt decodes raw (a member of the body at path) into v.
func decodeAt(raw json.RawMessage, path string, v any) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return typeError(path, err)
	}
	return nil
}

// typeError turns a decoding error at path ("" for the body) into a 400
// naming the field: "decode body: max_tokens: …", "messages[0].role: …".
func typeError(path string, err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return badRequest("%s: %v", cmp.Or(path, "decode body"), err)
	}
	at := path
	switch {
	case path == "" && te.Field != "":
		at = "decode body: " + te.Field
	case path == "":
		at = "decode body"
	case te.Field != "":
		at += "." + te.Field
	}
	return badRequest("%s: expected %s, got %s", at, openai.JSONKind(te.Type), te.Value)
}

// check validates the generation fields as vLLM's models do.
func (r *messagesRequest) check() error {
	var problems []string
	switch {
	case r.MaxTokens == nil:
		problems = append(problems, "max_tokens: required (an integer of at least 1)")
	case *r.MaxTokens <= 0:
		problems = append(problems, fmt.Sprintf("max_tokens %d: must be positive", *r.MaxTokens))
	}
	if r.Temperature != nil && *r.Temperature < 0 {
		problems = append(problems, "temperature: must not be negative")
	}
	if r.TopP != nil && (*r.TopP <= 0 || *r.TopP > 1) {
		problems = append(problems, "top_p: must be in (0, 1]")
	}
	if r.TopK != nil && *r.TopK < -1 {
		problems = append(problems, fmt.Sprintf("top_k %d: must be -1 (off), 0 or positive", *r.TopK))
	}
	if r.CacheSalt != nil && *r.CacheSalt == "" {
		problems = append(problems, "cache_salt: must be a non-empty string")
	}
	if !isJSONNull(r.Metadata) && r.Metadata[0] != '{' {
		problems = append(problems, "metadata: must be an object")
	}
	if !isJSONNull(r.KVTransferParams) && r.KVTransferParams[0] != '{' {
		problems = append(problems, "kv_transfer_params: must be an object")
	}
	if p := checkOutputConfig(r.OutputConfig); p != "" {
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		return badRequest("%s", strings.Join(problems, "; "))
	}
	return nil
}

// checkOutputConfig checks output_config ({effort, format}); "" when fine.
// Neither changes the prompt.
func checkOutputConfig(raw json.RawMessage) string {
	if isJSONNull(raw) {
		return ""
	}
	var oc struct {
		Effort json.RawMessage `json:"effort"`
		Format json.RawMessage `json:"format"`
	}
	if raw[0] != '{' || json.Unmarshal(raw, &oc) != nil {
		return "output_config: must be an object"
	}
	if e, ok := jsonString(oc.Effort); !isJSONNull(oc.Effort) && (!ok || !slices.Contains([]string{"low", "medium", "high", "xhigh", "max"}, e)) {
		return "output_config.effort: want low, medium, high, xhigh or max"
	}
	if !isJSONNull(oc.Format) && oc.Format[0] != '{' {
		return "output_config.format: must be an object"
	}
	return ""
}

// convert checks the prompt fields and builds the chat messages and tools.
func (p *anthropicPrompt) convert() error {
	msgs, err := p.decodeMessages()
	if err != nil {
		return err
	}
	system, err := p.systemBlocks()
	if err != nil {
		return err
	}
	if err := checkToolChoice(p.ToolChoice); err != nil {
		return err
	}
	if !isJSONNull(p.ChatTemplateKwargs) && p.ChatTemplateKwargs[0] != '{' {
		return badRequest("chat_template_kwargs: must be an object")
	}
	if p.chatTools, err = anthropicTools(p.Tools); err != nil {
		return err
	}
	if p.chat, err = chatMessages(system, msgs); err != nil {
		return err
	}
	if len(p.chat) == 0 {
		return badRequest("messages: no message left to render (user messages holding only tool_use or thinking blocks are dropped)")
	}
	return nil
}

// decodeMessages decodes the messages list.
func (p *anthropicPrompt) decodeMessages() ([]anthropicMessage, error) {
	if p.Messages == nil {
		return nil, badRequest("messages: required (a list of messages)")
	}
	if len(p.Messages) == 0 {
		return nil, badRequest("messages: at least one message is required")
	}
	out := make([]anthropicMessage, len(p.Messages))
	for i, raw := range p.Messages {
		m, err := decodeMessage(raw, fmt.Sprintf("messages[%d]", i))
		if err != nil {
			return nil, err
		}
		out[i] = m
	}
	return out, nil
}

// decodeMessage decodes one message: role user, assistant or system
// (Claude Code's "ctx" and "msg" are user, as vLLM maps them) and content,
// a string or a list of blocks.
func decodeMessage(raw json.RawMessage, path string) (anthropicMessage, error) {
	var m struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := decodeAt(raw, path, &m); err != nil {
		return anthropicMessage{}, err
	}
	if m.Role == nil {
		return anthropicMessage{}, badRequest("%s.role: required (user, assistant or system)", path)
	}
	out := anthropicMessage{role: *m.Role}
	switch out.role {
	case "user", "assistant", "system":
	case "ctx", "msg":
		out.role = "user"
	default:
		return anthropicMessage{}, badRequest("%s.role %q: want user, assistant or system", path, out.role)
	}
	var err error
	out.text, out.blocks, err = stringOrBlocks(m.Content, path+".content", true)
	return out, err
}

// systemBlocks decodes the top-level system: a string, a list of blocks,
// or absent.
func (p *anthropicPrompt) systemBlocks() (anthropicMessage, error) {
	text, blocks, err := stringOrBlocks(p.System, "system", false)
	return anthropicMessage{role: "system", text: text, blocks: blocks}, err
}

// stringOrBlocks decodes a content that is a string or a list of blocks
// (null only when not required).
func stringOrBlocks(raw json.RawMessage, path string, required bool) (*string, []contentBlock, error) {
	switch {
	case isJSONNull(raw) && required:
		return nil, nil, badRequest("%s: required (a string or a list of content blocks)", path)
	case isJSONNull(raw):
		return nil, nil, nil
	case raw[0] == '"':
		var s string
		err := decodeAt(raw, path, &s)
		return &s, nil, err
	case raw[0] != '[':
		return nil, nil, badRequest("%s: must be a string or a list of content blocks", path)
	}
	var list []json.RawMessage
	if err := decodeAt(raw, path, &list); err != nil {
		return nil, nil, err
	}
	blocks := make([]contentBlock, len(list))
	for j, b := range list {
		if err := decodeBlock(b, fmt.Sprintf("%s[%d]", path, j), &blocks[j]); err != nil {
			return nil, nil, err
		}
	}
	return nil, blocks, nil
}

// decodeBlock decodes and checks one content block.
func decodeBlock(raw json.RawMessage, path string, b *contentBlock) error {
	if err := decodeAt(raw, path, b); err != nil {
		return err
	}
	if !blockTypes[b.Type] {
		return badRequest("%s.type %q: want text, image, tool_use, tool_result, tool_reference, thinking or redacted_thinking", path, b.Type)
	}
	if !isJSONNull(b.Source) && b.Source[0] != '{' {
		return badRequest("%s.source: must be an object", path)
	}
	if !isJSONNull(b.Input) && b.Input[0] != '{' {
		return badRequest("%s.input: must be an object", path)
	}
	if c := b.Content; !isJSONNull(c) && c[0] != '"' && !isObjectList(c) {
		return badRequest("%s.content: must be a string or a list of objects", path)
	}
	return nil
}

// isObjectList reports whether raw is a JSON array of objects.
func isObjectList(raw json.RawMessage) bool {
	var list []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &list) != nil {
		return false
	}
	for _, e := range list {
		if len(e) == 0 || e[0] != '{' {
			return false
		}
	}
	return true
}

// checkToolChoice checks tool_choice ({type: auto|any|tool|none, name});
// it does not change the prompt.
func checkToolChoice(raw json.RawMessage) error {
	if isJSONNull(raw) {
		return nil
	}
	var tc struct {
		Type *string `json:"type"`
		Name *string `json:"name"`
	}
	if err := decodeAt(raw, "tool_choice", &tc); err != nil {
		return err
	}
	if tc.Type == nil || !slices.Contains([]string{"auto", "any", "tool", "none"}, *tc.Type) {
		return badRequest("tool_choice.type: want auto, any, tool or none")
	}
	if *tc.Type == "tool" && (tc.Name == nil || *tc.Name == "") {
		return badRequest("tool_choice.name is required when type is 'tool'")
	}
	return nil
}

// anthropicTools converts tools ({name, description, input_schema}) into
// the chat form vLLM builds: {"type": "function", "function": {name,
// description (null when absent), parameters: input_schema with "type":
// "object" added when missing, defer_loading}}.
func anthropicTools(tools []json.RawMessage) (json.RawMessage, error) {
	if tools == nil {
		return nil, nil
	}
	type function struct {
		Name         string          `json:"name"`
		Description  *string         `json:"description"`
		Parameters   json.RawMessage `json:"parameters"`
		DeferLoading *bool           `json:"defer_loading"`
	}
	type tool struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	out := make([]tool, len(tools))
	for i, raw := range tools {
		var t struct {
			Name         *string         `json:"name"`
			Description  *string         `json:"description"`
			InputSchema  json.RawMessage `json:"input_schema"`
			Strict       *bool           `json:"strict"`
			DeferLoading *bool           `json:"defer_loading"`
		}
		path := fmt.Sprintf("tools[%d]", i)
		if err := decodeAt(raw, path, &t); err != nil {
			return nil, err
		}
		if t.Name == nil {
			return nil, badRequest("%s.name: required (a string)", path)
		}
		schema, err := inputSchema(t.InputSchema, path)
		if err != nil {
			return nil, err
		}
		out[i] = tool{Type: "function", Function: function{Name: *t.Name, Description: t.Description, Parameters: schema,
			DeferLoading: t.DeferLoading}}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, badRequest("tools: %v", err)
	}
	return b, nil
}

// inputSchema checks a tool's input_schema (a required object) and adds
// "type": "object" at its end when it has no type, as vLLM does.
func inputSchema(raw json.RawMessage, path string) (json.RawMessage, error) {
	var members map[string]json.RawMessage
	if isJSONNull(raw) || raw[0] != '{' || json.Unmarshal(raw, &members) != nil {
		return nil, badRequest("%s.input_schema: required (an object)", path)
	}
	if _, ok := members["type"]; ok {
		return raw, nil
	}
	if len(members) == 0 {
		return json.RawMessage(`{"type":"object"}`), nil
	}
	body := bytes.TrimRight(raw, " \t\r\n")
	out := append(bytes.Clone(body[:len(body)-1]), `,"type":"object"}`...)
	return out, nil
}

// chatMessages converts the system field and the messages as vLLM does:
// one leading system message from the system field and every system
// message's text (billing-header blocks dropped), then each other message
// in order, the tool messages of a user message's tool_result blocks first.
func chatMessages(system anthropicMessage, msgs []anthropicMessage) ([]chatMessage, error) {
	var out []chatMessage
	if parts, ok := systemParts(system, msgs); ok {
		out = append(out, chatMessage{Role: "system", Content: openai.AppendString(nil, strings.Join(parts, ""))})
	}
	for i, m := range msgs {
		if m.role == "system" {
			continue
		}
		var err error
		if out, err = appendChatMessage(out, m, fmt.Sprintf("messages[%d]", i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// systemParts collects the system texts; ok reports whether there is any
// part at all (vLLM adds the system message even for one empty string).
func systemParts(system anthropicMessage, msgs []anthropicMessage) (parts []string, ok bool) {
	if system.text != nil && *system.text != "" { // vLLM: `if request.system`
		parts = append(parts, *system.text)
	}
	parts = appendSystemBlocks(parts, system.blocks)
	for _, m := range msgs {
		if m.role != "system" {
			continue
		}
		if m.text != nil {
			parts = append(parts, *m.text)
		}
		parts = appendSystemBlocks(parts, m.blocks)
	}
	return parts, len(parts) > 0
}

// appendSystemBlocks appends the non-empty text blocks that are not
// Claude Code's billing header.
func appendSystemBlocks(parts []string, blocks []contentBlock) []string {
	for _, b := range blocks {
		if b.Type == "text" && b.Text != nil && *b.Text != "" && !strings.HasPrefix(*b.Text, billingHeader) {
			parts = append(parts, *b.Text)
		}
	}
	return parts
}

// appendChatMessage appends the chat messages of one user or assistant
// message: a string content as it is; blocks as text and image parts,
// reasoning and tool calls (a single text part becomes the content
// string), a user's tool results as messages before it. A user message
// left without content is dropped.
func appendChatMessage(out []chatMessage, m anthropicMessage, path string) ([]chatMessage, error) {
	if m.text != nil {
		return append(out, chatMessage{Role: m.role, Content: openai.AppendString(nil, *m.text)}), nil
	}
	c := blockConv{role: m.role, out: out}
	for j, b := range m.blocks {
		if err := c.add(b, fmt.Sprintf("%s.content[%d]", path, j)); err != nil {
			return nil, err
		}
	}
	cm := chatMessage{Role: m.role, ToolCalls: c.calls}
	if len(c.reasoning) > 0 {
		r := strings.Join(c.reasoning, "")
		cm.Reasoning = &r
	}
	if err := setContent(&cm, c.parts); err != nil {
		return nil, badRequest("%s.content: %v", path, err)
	}
	if m.role == "user" && cm.Content == nil {
		return c.out, nil
	}
	return append(c.out, cm), nil
}

// blockConv collects what one message's blocks convert to.
type blockConv struct {
	role      string
	parts     []chatPart
	reasoning []string
	calls     []chatToolCall
	out       []chatMessage // the messages so far, with this message's tool results
}

// add converts block b (at path) as vLLM's _convert_block does;
// redacted_thinking and tool_reference blocks add nothing.
func (c *blockConv) add(b contentBlock, path string) error {
	switch b.Type {
	case "text":
		if b.Text != nil && *b.Text != "" {
			c.parts = append(c.parts, chatPart{Type: "text", Text: b.Text})
		}
	case "image":
		if isJSONNull(b.Source) || isEmptyObject(b.Source) {
			return nil
		}
		u, err := imageURL(b.Source, path+".source")
		if err != nil {
			return err
		}
		c.parts = append(c.parts, chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: u}})
	case "thinking":
		if b.Thinking != nil {
			c.reasoning = append(c.reasoning, *b.Thinking)
		}
	case "tool_use":
		c.calls = append(c.calls, toolCall(b))
	case "tool_result":
		if c.role != "user" {
			text := "Tool result: " + pyTruthyStr(b.Content)
			c.parts = append(c.parts, chatPart{Type: "text", Text: &text})
			return nil
		}
		var err error
		c.out, err = appendToolResult(c.out, b, path)
		return err
	}
	return nil
}

// setContent sets a message's content from its parts: none leaves it
// unset, a single text part is its text, else the list.
func setContent(cm *chatMessage, parts []chatPart) error {
	switch {
	case len(parts) == 0:
		return nil
	case len(parts) == 1 && parts[0].Type == "text":
		cm.Content = openai.AppendString(nil, *parts[0].Text)
		return nil
	}
	b, err := json.Marshal(parts)
	cm.Content = b
	return err
}

// isEmptyObject reports whether raw is {} (with any white space).
func isEmptyObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && len(m) == 0
}

// toolCall is a tool_use block as a chat tool call: its id (vLLM's
// "call_<unix time>" when it has none), name and json.dumps(input or {}).
func toolCall(b contentBlock) chatToolCall {
	id := fmt.Sprintf("call_%d", time.Now().Unix())
	if b.ID != nil && *b.ID != "" {
		id = *b.ID
	}
	name := ""
	if b.Name != nil {
		name = *b.Name
	}
	args := "{}"
	if !isJSONNull(b.Input) {
		if v, err := parsePy(b.Input); err == nil && len(v.keys) > 0 {
			args = v.dumps()
		}
	}
	return chatToolCall{ID: id, Type: "function", Function: chatFunction{Name: name, Arguments: args}}
}

// appendToolResult appends the messages of a user's tool_result block: a
// tool message with the result's text (a string, or the text items joined
// with "\n"), then a user message with its images, then a tool message
// with its tool references.
func appendToolResult(out []chatMessage, b contentBlock, path string) ([]chatMessage, error) {
	id := ""
	if b.ToolUseID != nil {
		id = *b.ToolUseID
	}
	text, images, refs, err := toolResultContent(b.Content, path+".content")
	if err != nil {
		return nil, err
	}
	out = append(out, chatMessage{Role: "tool", ToolCallID: &id, Content: openai.AppendString(nil, text)})
	if len(images) > 0 {
		parts := make([]chatPart, len(images))
		for i, u := range images {
			parts[i] = chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: u}}
		}
		c, err := json.Marshal(parts)
		if err != nil {
			return nil, badRequest("%s: %v", path, err)
		}
		out = append(out, chatMessage{Role: "user", Content: c})
	}
	if len(refs) > 0 {
		c, err := json.Marshal(refs)
		if err != nil {
			return nil, badRequest("%s: %v", path, err)
		}
		out = append(out, chatMessage{Role: "tool", ToolCallID: &id, Content: c})
	}
	return out, nil
}

// toolResultContent reads a tool_result's content: a string is the text; a
// list gives the text of its text items joined with "\n", the URLs of its
// image items and its tool_reference items (named by tool_name, else name).
func toolResultContent(raw json.RawMessage, path string) (text string, images []string, refs []chatPart, err error) {
	if s, ok := jsonString(raw); ok {
		return s, nil, nil, nil
	}
	var items []map[string]json.RawMessage
	if isJSONNull(raw) || json.Unmarshal(raw, &items) != nil {
		return "", nil, nil, nil
	}
	var texts []string
	for i, it := range items {
		at := fmt.Sprintf("%s[%d]", path, i)
		switch typ, _ := jsonString(it["type"]); typ {
		case "text":
			t, ok := jsonString(it["text"])
			if !ok && it["text"] != nil {
				return "", nil, nil, badRequest("%s.text: must be a string", at)
			}
			texts = append(texts, t)
		case "image":
			src := it["source"]
			if src == nil {
				src = json.RawMessage("{}")
			}
			u, err := imageURL(src, at+".source")
			if err != nil {
				return "", nil, nil, err
			}
			if u != "" {
				images = append(images, u)
			}
		case "tool_reference":
			if name := toolRefName(it); name != nil {
				refs = append(refs, chatPart{Type: "tool_reference", Name: name})
			}
		}
	}
	return strings.Join(texts, "\n"), images, refs, nil
}

// toolRefName is a tool_reference item's tool_name, else its name, when
// truthy in Python; nil otherwise.
func toolRefName(it map[string]json.RawMessage) json.RawMessage {
	for _, k := range []string{"tool_name", "name"} {
		if v, ok := it[k]; ok && pyTruthy(v) {
			return v
		}
	}
	return nil
}

// imageURL converts an image source to the URL vLLM puts in an image_url
// part: the url of a "url" source, else data:<media_type, default
// image/jpeg>;base64,<data> (values other than strings as Python's f-string
// writes them).
func imageURL(src json.RawMessage, path string) (string, error) {
	var s map[string]json.RawMessage
	if len(src) == 0 || src[0] != '{' || json.Unmarshal(src, &s) != nil {
		return "", badRequest("%s: must be an object", path)
	}
	if typ, _ := jsonString(s["type"]); typ == "url" {
		if s["url"] == nil {
			return "", nil
		}
		u, ok := jsonString(s["url"])
		if !ok {
			return "", badRequest("%s.url: must be a string", path)
		}
		return u, nil
	}
	mediaType, data := "image/jpeg", ""
	if v, ok := s["media_type"]; ok {
		mediaType = pyStr(v)
	}
	if v, ok := s["data"]; ok {
		data = pyStr(v)
	}
	return "data:" + mediaType + ";base64," + data, nil
}
