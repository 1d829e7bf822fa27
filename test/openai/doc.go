// Package openai holds kvmesh's end-to-end tests with real clients: the
// official `openai` npm client and other Node clients, OpenAI's official Go
// SDK and github.com/sashabaranov/go-openai, and Python's HTTP stacks (httpx,
// aiohttp): simulated engines behind an ingress, driven
// exactly as a user's application would call them. It owns no library code.
package openai
