"""One module per parallel dimension: each gives its candidates, the constraints a plan breaks, how it shards
the model and its activations, and its named time and memory parts.

- tensor.py    tensor parallelism and sequence parallelism (Megatron)
- pipeline.py  pipeline parallelism: stages, schedules, bubble, send/recv
- in_flight.py the micro-batches of activations a pipeline rank holds at its peak, per schedule
- data.py      data parallelism: DDP, ZeRO-1/2/3 / FSDP / HSDP, nn.DataParallel
- model_states.py  what the busiest GPU keeps of the model (ModelStates), which data.py builds and the others rewrite
- overlap.py   what the data-parallel collectives hide behind (Windows) and how idle time pools (hidden)
- expert.py    mixture of experts and expert parallelism: all-to-alls, grouped GEMMs, expert shards
- expert_layout.py  where EP and ETP sit among a stage's ranks: their constraints and search choices
"""
