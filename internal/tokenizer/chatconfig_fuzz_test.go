package tokenizer

import "testing"

// FuzzParseChatTemplateConfig: any tokenizer_config.json parses or fails
// with a clear error, never a panic; a
// parsed template renders a short chat or fails with an error.
func FuzzParseChatTemplateConfig(f *testing.F) {
	for _, s := range []string{
		`{"chat_template": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"}`,
		`{"chat_template": [{"name": "default", "template": "{{ messages[0].content }}"}, {"name": "tool_use", "template": "x"}], "bos_token": "<s>"}`,
		`{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": "{{ bos_token }}{{ messages | length }}"}`,
		`{"chat_template": "{% if %}"}`,
		`{}`,
		`[]`,
		`not json`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ct, err := ParseChatTemplateConfig(b)
		if err != nil {
			// Template syntax errors come from chattmpl unwrapped (not
			// ErrInvalid); they must still say what is wrong.
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		_, _ = ct.Render([]Message{{Role: "user", Content: "hi"}}, true)
	})
}
