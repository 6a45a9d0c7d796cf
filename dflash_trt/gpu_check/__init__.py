"""`make gpu-check`: one command that checks and measures the project's CUDA path on one GPU.

Sections (each recorded on its own, so one failure does not hide the others): build the kernels; the kernel against
the PyTorch reference at the Qwen3-8B and gpt-oss-120b drafter shapes, both cache outputs included; CUDA graph
capture and replay; compute-sanitizer memcheck and racecheck on small cases; the decoding loop on CUDA with a
random-weight Qwen3-8B-width target and drafter against transformers' greedy generate (drafter and verify eager
and graphed, a fixed batch and requests joining and leaving through the scheduler); t_AR, t_draft and t_verify(16), eager and replayed from CUDA graphs, with the speedup they imply at the
paper's tau; the kernel's time against PyTorch SDPA and the HBM floor.
Without a CUDA device it refuses with one line and a non-zero exit before doing anything.
"""
