package main

import (
	"context"
	"flag"
	"io"
	"os"

	"github.com/kvmesh/kvmesh/epp"
)

// runEPP runs the Gateway API Inference Extension endpoint picker (epp.Run):
// an ingress replica answering the gateway over ext_proc. Every ingress flag
// applies (--listen is the HTTP listener for /metrics, /health and /ready
// only: the client API is the gateway's).
func runEPP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := eppOptions(args, stderr)
	if err != nil {
		return err
	}
	return epp.Run(ctx, opts, stdout, stderr)
}

// eppOptions parses and checks `kvmesh epp`'s arguments.
func eppOptions(args []string, stderr io.Writer) (epp.Options, error) {
	opts := epp.DefaultOptions()
	fs := newFlagSet("epp", stderr)
	var probs flagProblems
	ingressFlags(fs, &opts.Ingress, &probs)
	eppFlags(fs, &opts)
	fs.Lookup("listen").Usage = "HTTP address for /metrics, /health and /ready (no client API: that is the gateway's)"
	fs.Lookup("admin").Usage = "admin address for /debug/* (pprof, engines, index, config, health, tokenizers) and /metrics, which then leaves --listen (empty: off; /metrics stays on --listen, behind the client credential when API keys or JWTs are on)"
	for _, name := range []string{"config", "cors-origins", "max-attempts", "chat-mode", "pd-policy", "pd-transfer-gbps"} { // eppFlagsRead
		if f := fs.Lookup(name); f != nil {
			f.Usage = "not read by kvmesh epp: refused (the ingress's flag)"
		}
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return opts, durationHint(fs, err)
	}
	// The picker buffers each request body until it routes (every body
	// mode), so --max-body bounds one body and --max-body-in-flight all
	// of them at once, as on the ingress (epp/process.go charges them).
	opts.Picker.MaxBodyBytes = opts.Ingress.Config.MaxBodyBytes
	probs.addErr(opts.Validate())
	eppFlagsRead(fs, &opts, &probs)
	return opts, probs.err()
}

// eppFlagsRead adds a problem for each flag given that the picker does not
// read (ingressFlagsRead's rules included, the picker's first: one problem a
// flag): its TLS files outside --grpc-tls=files (it would serve its
// self-signed certificate instead), the pool's flags without --pool-name,
// --pd-min-uncached without --pd, and the ingress flags of what the
// gateway does here (proxying, retries, CORS, rewriting chat, the
// ingress's P/D legs; the picker takes no --config file). The proxy
// timeouts are read: --send-timeout bounds the writes of --listen's
// answers, --upstream-idle-timeout and --upstream-first-byte-timeout the
// engine /tokenize connections.
func eppFlagsRead(fs *flag.FlagSet, o *epp.Options, probs *flagProblems) {
	notFiles := o.Picker.TLS != epp.TLSFiles
	const pd = "by kvmesh epp (the ingress's P/D step runs the prefill leg itself; the picker's P/D is --pd, which names the prefill engine to llm-d's routing sidecar)"
	ingressFlagsRead(fs, &o.Ingress, probs,
		offFlag{"grpc-tls-cert", notFiles, "without --grpc-tls=files"},
		offFlag{"grpc-tls-key", notFiles, "without --grpc-tls=files"},
		offFlag{"pool-namespace", o.PoolName == "", "without --pool-name"},
		offFlag{"kubeconfig", o.PoolName == "", "without --pool-name"},
		offFlag{"pd-min-uncached", !o.Picker.PD.Enabled, "without --pd"},
		offFlag{"pd-policy", true, pd},
		offFlag{"pd-transfer-gbps", true, pd},
		offFlag{"config", true, "by kvmesh epp (give its settings as flags)"},
		offFlag{"cors-origins", true, "by kvmesh epp (the gateway answers browsers)"},
		offFlag{"max-attempts", true, "by kvmesh epp (the gateway retries down the picker's --max-endpoints fallbacks)"},
		offFlag{"chat-mode", true, "by kvmesh epp (the request body reaches the engine unchanged)"},
	)
}

// eppFlags binds the picker's own flags onto opts.
func eppFlags(fs *flag.FlagSet, o *epp.Options) {
	c := &o.Picker
	fs.StringVar(&c.Listen, "grpc", c.Listen, "ext_proc + gRPC health address (the InferencePool's endpointPickerRef port)")
	fs.StringVar(&c.TLS, "grpc-tls", c.TLS, "ext_proc TLS: self-signed (what GAIE gateways expect), files (--grpc-tls-cert/--grpc-tls-key) or off")
	fs.StringVar(&c.TLSCertFile, "grpc-tls-cert", "", "PEM certificate for --grpc-tls=files")
	fs.StringVar(&c.TLSKeyFile, "grpc-tls-key", "", "PEM key for --grpc-tls=files")
	fs.DurationVar(&c.DrainDelay, "drain-delay", c.DrainDelay, "on SIGTERM, keep serving (health NOT_SERVING) this long before closing the port, while the gateway learns the pod is leaving; then --drain-timeout")
	fs.StringVar(&c.DefaultBodyMode, "body-mode", c.DefaultBodyMode, "request body mode when the gateway sends no protocol_config: full-duplex, buffered or streamed")
	fs.IntVar(&c.MaxEndpoints, "max-endpoints", c.MaxEndpoints, "fallback endpoints per answer")
	in := &o.Ingress.Config
	fs.Int64Var(&in.MaxBodyBytesInFlight, "max-body-in-flight", in.MaxBodyBytesInFlight, "max request body bytes the picker buffers at once over all streams, its own memory bound (503 + Retry-After above; bodies up to 64 KiB always pass; 0: off; else >= --max-body)")
	fs.BoolVar(&c.PD.Enabled, "pd", false, "P/D through llm-d's routing sidecar (x-prefiller-host-port)")
	fs.IntVar(&c.PD.MinUncachedTokens, "pd-min-uncached", c.PD.MinUncachedTokens, "prefill elsewhere from this many uncached prompt tokens")
	fs.StringVar(&o.PoolName, "pool-name", "", "InferencePool to serve (empty: every engine of the mesh is a candidate)")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", os.Getenv("POD_NAMESPACE"), "the InferencePool's namespace (env POD_NAMESPACE)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file for the pool informer (empty: in-cluster)")
}
