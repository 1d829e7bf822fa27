// Package pd is the prefill/decode step of the scheduler: for each request
// it decides whether to disaggregate at all and, if so, which (prefill,
// decode) pair serves it. It is one more scheduler step, not a second
// scheduler: the candidates come from scheduler.Scheduler.WithCandidates
// (the same filters, index lookup and tier weights as every policy) and
// kvmesh's own choice prices every option with the aggregated policy's cost
// model (policies.KVMesh.Terms).
//
// An option is either aggregated (a mixed or decode engine prefills locally
// and decodes) or a pair (a prefill engine computes the prompt, the decode
// engine reads the KV over the network and decodes). Pairs form only within
// one P/D group (scheduler.Engine.Group) and one P/D protocol
// (scheduler.Engine.PDProtocol: an SGLang prefill server cannot hand its KV
// to a NIXL or plain engine). A Policy scores options; Router
// ranks them best first, so the ingress can fall back down the list when a
// leg fails before the first byte.
//
// The package also holds emulations of the published P/D routers' choices
// (Kthena, llm-d, Dynamo, SGLang's gateway, AIBrix) for the benchmarks;
// docs/PD.md lists their sources. It must not touch the network, the index
// (other than through the Scheduler) or the ingress.
package pd
