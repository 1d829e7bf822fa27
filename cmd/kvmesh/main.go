// Command kvmesh is the one kvmesh binary. Each subcommand lives in its own file
// and only parses flags and wires packages together; the work is in the packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/logutil"
)

// command is one subcommand. run gets the arguments after the subcommand name
// and writes its normal output to stdout.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the one place subcommands are registered.
var commands = []command{
	{"keys", "print the canonical kvmesh block key of every full block of a token sequence", runKeys},
	{"inspect", "decode KV events (inspect events) or tail the NATS delta stream (inspect stream)", runInspect},
	{"tokenize", "tokenize text or a chat with a Hugging Face tokenizer.json", runTokenize},
	{"sim", "run the vLLM-compatible engine simulator", runSim},
	{"sidecar", "run the sidecar next to one engine (or every engine on a node)", runSidecar},
	{"ingress", "run a stateless OpenAI-compatible ingress replica", runIngress},
	{"epp", "run the Gateway API Inference Extension endpoint picker (ext_proc) for Envoy-based gateways", runEPP},
	{"bench", "compare routing policies (discrete-event simulation)", runBench},
	{"demo", "run the whole mesh on loopback and compare random with kvmesh routing", runDemo},
	{"bootstrap", "create the installation's Secrets once (NATS users' passwords, gossip key)", runBootstrap},
	{"loadtest", "send a workload to an OpenAI-compatible endpoint and report latency", runLoadtest},
	{"orchestrator", "run the Kubernetes controller for ModelDeployments and the sidecar webhook", runOrchestrator},
	{"get", "list ModelDeployments, AutoscalingPolicies, RoleScalers (API server) or engines (mesh gossip)", runGet},
	{"describe", "show one ModelDeployment, AutoscalingPolicy, RoleScaler or engine", runDescribe},
}

// errUsage marks a command-line mistake: exit status 2, after the usage text.
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		usage(stderr)
		return 2
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help" && len(args) == 1:
		usage(stdout) // asked for: on stdout, so `kvmesh -h | less` shows it
		return 0
	case args[0] == "help":
		// kvmesh help ingress: asked for, so on stdout as the top-level
		// help (an unknown command's suggestion stays on stderr).
		for _, c := range commands {
			if c.name == args[1] {
				return run([]string{args[1], "-h"}, stdout, stdout)
			}
		}
		return run([]string{args[1], "-h"}, stdout, stderr)
	case args[0] == "version" || args[0] == "--version" || args[0] == "-version":
		fmt.Fprintln(stdout, "kvmesh", version())
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		ctx, stop := signalContext(stderr, c.name, args[1:], os.Exit)
		defer stop()
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			// Text in every format: a command-line mistake is read by
			// whoever typed it, next to the flag package's usage text.
			fmt.Fprintf(stderr, "kvmesh %s: %v\n", c.name, err)
			return 2
		default:
			fatal(stderr, c.name, args[1:], err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "kvmesh: unknown command %q\n", args[0])
	if m := closest(args[0]); m != "" {
		fmt.Fprintf(stderr, "Did you mean %q?\n", m)
	}
	fmt.Fprintln(stderr, "Run 'kvmesh -h' for the commands.")
	return 2
}

// closest is the command name within two edits of name, "" when none is.
func closest(name string) string {
	best, bestD := "", 3
	for _, c := range commands {
		if d := editDistance(name, c.name); d < bestD {
			best, bestD = c.name, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// version is the build's version, as the ingress's GET /version says it
// (ingress.BuildVersion).
func version() string { return ingress.BuildVersion() }

// signalContext is a context that SIGINT, SIGTERM or SIGHUP cancels (the
// command drains and returns; SIGHUP reloads nothing, since the files that
// can change under a running command are watched, and its default action
// ended the process with no drain, cutting streams mid-answer); a second
// signal exits at once, through exit with
// status 1, after a fatal line saying so: the drain may wait for a long
// stream (--drain-timeout), and whoever pressed Ctrl-C twice does not want
// to. stop releases the signals.
func signalContext(stderr io.Writer, name string, args []string, exit func(int)) (ctx context.Context, stop func()) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go watchSignals(ch, done, cancel, func(sig os.Signal) {
		fatal(stderr, name, args, fmt.Errorf("second signal (%v) while draining: exiting now, without draining", sig))
		exit(1)
	})
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}

// watchSignals cancels on the first signal of ch and calls force on the
// second, until done closes.
func watchSignals(ch <-chan os.Signal, done <-chan struct{}, cancel func(), force func(os.Signal)) {
	select {
	case <-ch:
		cancel()
	case <-done:
		return
	}
	select {
	case sig := <-ch:
		force(sig)
	case <-done:
	}
}

// logFormatCommands are the commands with --log-format, with its default:
// their fatal error is one JSON object in JSON mode, as their log lines are.
var logFormatCommands = map[string]string{"sim": logutil.Text, "sidecar": logutil.JSON, "ingress": logutil.JSON, "epp": logutil.JSON, "orchestrator": logutil.JSON}

// fatal writes the error a command failed with (not a usage error):
// "kvmesh <name>: <err>", or
// in JSON mode (the default of those commands but sim) one JSON log line
// {"time":...,"level":"ERROR","msg":"kvmesh <name> exiting","err":...}, so a
// JSON-only log pipeline keeps the line that says why the process stopped.
func fatal(stderr io.Writer, name string, args []string, err error) {
	if def, ok := logFormatCommands[name]; ok && argLogFormat(args, def) == logutil.JSON {
		logutil.New(stderr, logutil.JSON, slog.LevelError).Error("kvmesh "+name+" exiting", "err", err.Error())
		return
	}
	fmt.Fprintf(stderr, "kvmesh %s: %v\n", name, err)
}

// argLogFormat is the --log-format args give (the last one, as the flag
// package takes it), def (the command's default) when none does.
func argLogFormat(args []string, def string) string {
	format := def
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "log-format" {
			continue
		}
		if !hasVal && i+1 < len(args) {
			i++
			val = args[i]
		}
		format = val
	}
	return format
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "kvmesh — a KV-cache-aware router for LLM inference")
	fmt.Fprintln(w, "\nUsage: kvmesh <command> [flags]\n\nCommands:")
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(w, "  %-*s  %s\n", width, c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'kvmesh <command> -h' (or 'kvmesh help <command>') for a command's flags, 'kvmesh version' for the version.")
}

// newFlagSet returns a flag set that reports errors instead of exiting, so
// every command fails the same way.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvmesh "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args into fs and accepts at most maxArgs positional
// arguments. Every command-line mistake (an unknown or malformed flag, a stray
// argument) wraps errUsage, so every command exits 2 for it; -h returns
// flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, maxArgs int) error {
	// The flag package prints its error and the whole flag list on a parse
	// error (150 lines for the ingress, the one that matters in the
	// middle); only -h gets the list here, a mistake one line and a hint.
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if usage != nil {
				usage()
			} else {
				fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
				fs.PrintDefaults()
			}
			return err
		}
		return fmt.Errorf("%w: %w (%s -h lists the flags)", errUsage, err, fs.Name())
	}
	if fs.NArg() > maxArgs {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args()[maxArgs:])
	}
	return nil
}
