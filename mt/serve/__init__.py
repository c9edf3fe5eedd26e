"""The translation server of `mt serve`: an HTTP API and a web page over one loaded model,
with requests batched together for one decoding worker."""
