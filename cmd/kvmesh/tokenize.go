package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/kvmesh/kvmesh/internal/tokenizer"
)

// runTokenize prints the token ids of a text or a chat as one JSON array.
func runTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tokenize", stderr)
	tokPath := fs.String("tokenizer", "", "Hugging Face tokenizer.json, or the model directory holding it (tiktoken.model too), as the ingress's --tokenizer (required)")
	special := fs.Bool("special", false, "add the post-processor's special tokens (e.g. <|begin_of_text|>)")
	chatPath := fs.String("chat-template", "", "tokenizer_config.json with chat_template; requires --messages")
	msgPath := fs.String("messages", "", "JSON array of {role, content} to render with --chat-template")
	noGen := fs.Bool("no-generation-prompt", false, "with --messages: do not append the assistant header")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvmesh tokenize --tokenizer tokenizer.json|DIR [--special] [--chat-template tokenizer_config.json --messages FILE] [TEXTFILE]")
		fmt.Fprintln(stderr, "Prints the ids as one JSON array; reads stdin when no TEXTFILE is given.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	switch {
	case *tokPath == "":
		return fmt.Errorf("%w: --tokenizer is required", errUsage)
	case (*chatPath == "") != (*msgPath == ""):
		return fmt.Errorf("%w: --chat-template and --messages go together", errUsage)
	case *msgPath != "" && fs.NArg() > 0:
		return fmt.Errorf("%w: give either --messages or TEXTFILE", errUsage)
	case *noGen && *msgPath == "":
		return fmt.Errorf("%w: --no-generation-prompt is read with --messages only", errUsage)
	}
	tk, err := tokenizer.LoadPath(*tokPath) // a file, or a model directory as the ingress and the simulator take
	if err != nil {
		return err
	}
	var text string
	addSpecial := *special
	if *msgPath != "" {
		ct, err := tokenizer.LoadChatTemplateFile(*chatPath)
		if err != nil {
			return err
		}
		msgs, err := os.ReadFile(*msgPath)
		if err != nil {
			return fmt.Errorf("read messages: %w", err)
		}
		if text, err = ct.RenderJSON(msgs, !*noGen, nil); err != nil {
			return err
		}
	} else {
		var in io.Reader = os.Stdin
		if fs.NArg() == 1 {
			f, err := os.Open(fs.Arg(0))
			if err != nil {
				return fmt.Errorf("read text: %w", err)
			}
			defer f.Close()
			in = f
		}
		b, err := io.ReadAll(in)
		if err != nil {
			return fmt.Errorf("read text: %w", err)
		}
		text = string(b)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ids := tk.Encode(text, addSpecial)
	out := make([]byte, 0, len(ids)*7+2)
	out = append(out, '[')
	for i, id := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendUint(out, uint64(id), 10)
	}
	out = append(out, ']', '\n')
	_, err = stdout.Write(out)
	return err
}
