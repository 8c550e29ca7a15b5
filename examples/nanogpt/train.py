"""A nanoGPT-style training script: a plain PyTorch loop, not attune's trainer and no framework.

It follows karpathy/nanoGPT's train.py: module-level defaults overridden by config files and ``--key=value``
arguments the way nanoGPT's configurator reads them (our own ``configure.py``), batches drawn with ``torch.randint`` from one token stream, gradient accumulation
over ``gradient_accumulation_steps`` micro-steps (divided among DDP processes under torchrun, as nanoGPT does),
AdamW with a cosine learning-rate schedule over ``max_iters``, and one line per iteration::

    iter 12: loss 3.1234, time 41.57ms, mfu 0.01%

One difference from nanoGPT: the loss printed is the mean over the iteration's micro-steps (nanoGPT prints the last
micro-step's), so the line means the same thing whatever the micro-batch split. Nothing is downloaded: the text is a
deterministic synthetic corpus built here (character level, 64 symbols), so the loss really falls.

    python train.py --batch_size=1 --gradient_accumulation_steps=32 --compile=False
    torchrun --standalone --nproc_per_node=2 train.py --batch_size=4 --gradient_accumulation_steps=8
"""
import math
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# default config values (nanoGPT's names)
out_dir = 'out'
log_interval = 1
max_iters = 5000
seed = 1337
# data
dataset = 'synthetic'
gradient_accumulation_steps = 32  # used to simulate larger batch sizes
batch_size = 1  # micro-batch size
block_size = 64
# model
n_layer = 4
n_head = 4
n_embd = 64
dropout = 0.0
bias = False
# adamw optimizer
learning_rate = 6e-4
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
# learning rate decay settings
decay_lr = True
warmup_iters = 100
lr_decay_iters = 5000
min_lr = 6e-5
# system
device = 'cpu'
dtype = 'float32'
compile = False
# simulated slow storage: each micro-batch read waits this long (a step time that does not move with CPU load)
read_latency_ms = 0
backend = 'gloo'
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]
from configure import apply  # noqa: E402 - config files and --key=value over the settings above, as nanoGPT reads them

apply(globals(), sys.argv[1:])
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group(backend=backend)
    ddp_rank, ddp_world_size = dist.get_rank(), dist.get_world_size()
    master_process = ddp_rank == 0
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    ddp_rank, ddp_world_size, master_process = 0, 1, True
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,}")
torch.manual_seed(seed + ddp_rank)
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = torch.autocast(device_type='cpu', dtype=ptdtype) if ptdtype != torch.float32 else torch.autocast('cpu', enabled=False)

# the corpus: 200k characters of 64 symbols with structure a small model can learn
vocab_size = 64
g = torch.Generator().manual_seed(0)
base = torch.randint(0, vocab_size, (512,), generator=g)
steps = torch.randint(1, 4, (200_000 // 8,), generator=g).repeat_interleave(8)
data = (base[torch.arange(200_000) % 512] + torch.cumsum(steps, 0)) % vocab_size


def get_batch():
    if read_latency_ms:
        time.sleep(read_latency_ms / 1000)  # one read per micro-batch, whatever its size
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=dropout, bias=bias, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd, bias=bias), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd, bias=bias), nn.Dropout(dropout))

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


torch.manual_seed(seed)  # the same initial weights on every process
model = GPT().to(device)
torch.manual_seed(seed + ddp_rank)
n_params = sum(p.numel() for p in model.parameters())
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2), weight_decay=weight_decay)
if compile:
    print("compiling the model... (takes a ~minute)")
    model = torch.compile(model)
if ddp:
    model = DDP(model)


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


X, Y = get_batch()
t0 = time.time()
iter_num = 0
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr
    total = torch.zeros(())
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        with ctx:
            loss = model(X, Y) / gradient_accumulation_steps
        X, Y = get_batch()  # prefetch the next micro-batch, as nanoGPT does
        loss.backward()
        total += loss.detach()
    if ddp:
        dist.all_reduce(total)
        total /= ddp_world_size
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        flops = 6 * n_params * tokens_per_iter
        mfu = flops / dt / 1e12
        print(f"iter {iter_num}: loss {total.item():.4f}, time {dt * 1000:.2f}ms, mfu {mfu * 100:.2f}%", flush=True)
    iter_num += 1
    if iter_num > max_iters:
        break

if ddp:
    dist.destroy_process_group()
