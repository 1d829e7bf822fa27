// Package openai holds kvmesh's end-to-end test with the official `openai`
// npm client: simulated engines behind an ingress, driven from Node.js
// exactly as a user's application would call them. It owns no library code.
package openai
