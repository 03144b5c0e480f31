"""Sample from a trained model's checkpoint. Settings are overridden as train.py's are:
``--name=value`` (e.g. ``python sample.py --seed=2``)."""

import os
import sys
from ast import literal_eval
from contextlib import nullcontext

import torch

from model import GPT, GPTConfig

out_dir = 'out'
start = [1, 4, 13]
num_samples = 2
max_new_tokens = 12
temperature = 0.8
top_k = 10
seed = 1337
device = 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float32'
for arg in sys.argv[1:]:
    key, val = arg[2:].split('=', 1)
    assert key in globals(), f"unknown config key {key}"
    try:
        val = literal_eval(val)
    except (SyntaxError, ValueError):
        pass
    globals()[key] = val

torch.manual_seed(seed)
device_type = 'cuda' if 'cuda' in device else 'cpu'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

ckpt_path = os.path.join(out_dir, 'ckpt.pt')
checkpoint = torch.load(ckpt_path, map_location=device)
gptconf = GPTConfig(**checkpoint['model_args'])
model = GPT(gptconf)
state_dict = checkpoint['model']
model.load_state_dict(state_dict)
model.eval()
model.to(device)

x = torch.tensor(start, dtype=torch.long, device=device)[None, ...]

with torch.no_grad():
    with ctx:
        for k in range(num_samples):
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k)
            print('sample:', ' '.join(str(t) for t in y[0].tolist()))
