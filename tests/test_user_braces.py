"""The user's code inside the converter's templates: its braces (f-strings, dict and set
literals) are code, not placeholders. A checkpoint saved under an f-string path made the
rewriter raise KeyError (an internal error: the whole file left unconverted), as the
denoising-diffusion trainer's ``torch.save(data, str(folder / f'model-{milestone}.pt'))`` did."""

from __future__ import annotations

import textwrap

from test_training_scripts import _run

from torch2jax.convert import convert_source

PROGRAM = textwrap.dedent("""
    import os
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    for step in range(3):
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out_dir = "ckpts"
    os.makedirs(out_dir, exist_ok=True)
    milestone = 3
    data = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    torch.save(data, f"{out_dir}/model-{milestone}.pt")
    print(sorted(os.listdir(out_dir)))
""")


def test_a_checkpoint_saved_under_an_f_string_path_converts_and_runs(tmp_path) -> None:
    result = convert_source(PROGRAM, path="train.py")
    assert not [d for d in result.diagnostics if d.rule == "internal"]
    assert 'f"{out_dir}/model-{milestone}.pt"' in result.code
    assert "ocp.PyTreeCheckpointer().save(" in result.code
    # the converted program writes the orbax checkpoint where torch wrote its file
    assert _run(result.code, tmp_path) == ["['model-3.pt']"]


def test_braces_of_the_users_code_reach_the_output_unchanged() -> None:
    # a set literal and a dict comprehension in a random_split and a DataLoader keyword
    source = textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset, random_split

        ds = TensorDataset(torch.arange(10.0))
        sizes = {"train": 8, "val": 2}
        train, val = random_split(ds, [sizes[k] for k in ("train", "val")])
        loader = DataLoader(train, batch_size={"small": 2}["small"])
        print(len(loader))
    """)
    result = convert_source(source, path="data.py")
    assert not [d for d in result.diagnostics if d.rule == "internal"], result.diagnostics
    assert '{"small": 2}["small"]' in result.code


def test_a_todo_quoting_a_call_written_over_several_lines_is_one_comment() -> None:
    # timm's Kron optimizer: the receiver of .to() is a call over four lines; its quoted code
    # made a comment node with line breaks, and libcst refused it (the whole file failed)
    source = textwrap.dedent('''
        import torch


        class Opt(torch.optim.Optimizer):
            def step(self, p, state, exprs, m):
                pre_grad = self._precond_grad(
                    state["Q"],
                    exprs,
                    m,
                ).to(dtype=p.dtype)
                return pre_grad
    ''')
    result = convert_source(source, path="kron.py")
    todos = [line.strip() for line in result.code.splitlines() if "TODO(torch2jax)" in line]
    assert todos, result.code
    assert any('self._precond_grad( state["Q"], exprs, m, ).to(...)' in t for t in todos), todos
    messages = [d.message for d in result.diagnostics]
    assert all("\n" not in msg for msg in messages), messages
