"""What attune's policies know and say, below every policy: the bottleneck diagnosis, lessons from past runs,
the surrogate of a knob's effect, the LLM chat client, the sidecar's wire protocol and the local LLM server.

The policies themselves (the playbook, the LLM policy, and the benchmark's baselines) live in
:mod:`attune.policies`, their one home; the sidecar service that serves any of them over HTTP is
:mod:`attune.sidecar`, above both. Nothing here imports Kubernetes; only :mod:`attune.agent.chat` imports ``openai``
(lazily).
"""
