"""Distributed training from first principles, one module per topic (lectures 05-10):

- `launch`: run a function on N local processes that form a process group (torchrun for notebooks).
- `workers`: small worker functions for `launch` demos (notebook 07).
- `collectives`: broadcast, reduce, all-reduce (naive, tree, ring), ... from send/recv; traffic counting.
- `ring`: the ring all-reduce schedule: which chunk moves where at each of the 2(N-1) steps.
- `costmodel`: the alpha-beta cost model of all-reduce: predict, measure, fit.
- `network`: one model of a cluster's network (NVLink inside a node, every card between nodes) and of
  NCCL's ring and tree on it; "what if?" for real clusters; used by the lectures and by `simulate`.
- `paramserver`: a parameter server, the other way to combine gradients, against ring all-reduce.
- `data_parallel`: nn.DataParallel's single-process sequence, simulated; why the master is a bottleneck.
- `dp_report`: what that sequence costs: traffic against K, its timeline, DP vs DDP vs model parallel.
- `ddp`: distributed data parallel from scratch (flat, bucketed), checked against torch's DDP.
- `ddp_overlap`: DDP's overlap seen: a timeline of a few 2-rank steps, and a sweep over bucket sizes.
- `ddp_hooks`: torch DDP beyond the defaults: gradient-compressing comm hooks, Join for uneven inputs.
- `multinode`: multi-node training with torchrun, run for real as N "nodes" on localhost.
- `faults`: kill a rank on purpose, to watch a job survive it.
- `hang`: a hang found, not guessed: one rank skips a collective, a timeout ends it, the Flight Recorder says who.
- `sharded_checkpoint`: checkpoints at scale: every rank writes its own shard (torch.distributed.checkpoint).
- `reshard_checkpoint`: a 2-D sharded checkpoint loaded at another world size, and a torn save that never wins.
- `schedules`: pipeline schedules as data (GPipe, 1F1B), their bubble and memory.
- `pipeline`: model and pipeline parallelism: a model cut into stages, send/recv between them.
- `schedules_zb`: schedules that shrink the bubble (interleaved 1F1B, ZB-H1, ZB-V) as per-rank actions.
- `pipeline_torch`: torch.distributed.pipelining's interleaved and zero-bubble schedules, read and run.
- `pipeline_trace`: a measured pipeline timeline (a few steps under the profiler) next to its schedule.
- `tensor_parallel`: column- and row-parallel Linear layers (Megatron-LM style).
- `tensor_parallel_block`: tensor and sequence parallelism for a transformer block (`course_lib.vit.Block`).
- `spmd`: one program on a 2-D device mesh: data parallel over "dp", tensor parallel over "tp".
- `context_parallel`: context parallelism: ring attention over a sequence split across the ranks.
- `moe`: mixture of experts, and expert parallelism: tokens travel to their experts by all-to-all.
- `sharding`: ZeRO's memory arithmetic, a hand-sharded optimizer, FSDP2 helpers.
- `sharding_workers`: workers that measure sharded training against DDP.
- `fsdp_tp`: FSDP2 over "dp" composed with tensor parallelism over "tp" on a 2-D mesh (`--strategy fsdp_tp`).

A spawned process imports its worker function by module and name, so workers live in these
modules (`workers` and the topic modules' own, `fn(rank, world_size, ...)`), not in notebook
cells. The one exception is the exercise checks: `course_lib.grading.student` sends the source
of a learner's notebook-defined function to the workers, which compile it there.
"""
