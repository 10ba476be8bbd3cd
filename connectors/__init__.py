"""KV offload for the Continuum plugin.

Installed as ``vllm_continuum_plugin.connectors`` (the repository keeps the
folder at the top level): ``kv_offload.ContinuumOffloadConnector`` (a vLLM
KV connector that copies KV blocks to host memory and reloads them),
``cpu_store.CPUStore`` (the byte-budgeted LRU store, keyed by block hash),
``block_copier`` (whole-block copies between the KV cache and host memory:
synchronous on CPU, side-stream on CUDA), ``native_offload`` (vLLM's own
``OffloadingConnector`` on the CPU platform) and ``offload_metrics`` (the connector's typed stats
and Prometheus metrics).

Importing this package imports nothing heavy; the connector module imports
vLLM and torch.
"""

CONNECTOR_MODULE = __name__ + ".kv_offload"
