"""One optimizer update, all of it in this folder: which kind a run makes (build.py:
`resolve_update`, the one reader of train.update, and `build_update`), the kinds (step.py's
PlainUpdate and DeviceUpdate, graphed.py's GraphUpdate), the device update's exchange of
gradients between ranks (exchange.py), the updates that did not happen (skips.py), the loss
compiled with the model inside (compiled.py), the learning-rate schedule (schedule.py) and the
optimizer (optim.py). The rest of mt sees `build_update`, the `Update` interface (a call and
`settle`) and the schedule.

The runtime paths, each with its tests (tests/test_step.py; tests/test_distributed.py and
tests/test_exchange.py for the ranks):

- plain: the update as a textbook writes it, the host reading its loss: one CPU process,
  fp16 (whose GradScaler reads the host anyway), and ranks under PyTorch's DDP
  (train.data_parallel ddp, exchanging in the last micro-batch's backward pass);
- device: a GPU or ranks on the flat exchange (one all-reduce of flat buffers), the gradients
  divided, clipped and skipped on the device, nothing read by the host;
- graph: the device update of one process recorded once as a CUDA graph and replayed.
"""
