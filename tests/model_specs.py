"""Small model specs for tests: one per family, a user `module:` model and a transformers config."""

from __future__ import annotations

import torch
from torch import nn

SMALL: dict[str, dict] = {
    "gpt": dict(family="gpt", hidden=64, layers=2, heads=4, seq_len=16, vocab=128),
    "gpt2": dict(family="gpt2", hidden=64, layers=2, heads=4, seq_len=16, vocab=128),
    "bert": dict(family="bert", hidden=64, layers=2, heads=4, seq_len=16, vocab=128),
    "t5": dict(family="t5", hidden=64, layers=2, decoder_layers=1, heads=4, seq_len=16, vocab=128),
    "vit": dict(family="vit", hidden=64, layers=2, heads=4, image_size=32, patch_size=8),
    "deit": dict(family="deit", hidden=64, layers=2, heads=4, image_size=32, patch_size=8),
    "llama": dict(family="llama", hidden=64, layers=2, heads=4, kv_heads=2, seq_len=16, vocab=128),
}


class ToyBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Toy(nn.Module):
    """A user model for `module:` specs (tests.model_specs:build_toy)."""

    def __init__(self, d: int = 16, n: int = 3):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(ToyBlock(d) for _ in range(n))
        self.out = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def build_toy(d: int = 16, n: int = 3) -> nn.Module:
    return Toy(d, n)


TOY = dict(module="tests.model_specs:build_toy", kwargs={"d": 16, "n": 3}, inputs=[{"shape": [8, 16]}])
HF_GPT2 = dict(hf_config={"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32,
                          "vocab_size": 100})


class DecoderBlock(nn.Module):
    """A pre-norm decoder block in plain PyTorch: causal self-attention and a GELU MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.out_proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.act, self.fc2 = nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out_proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class Decoder(nn.Module):
    """A user's decoder-only language model (tests.model_specs:build_decoder): embedding, blocks, head."""

    def __init__(self, hidden: int, layers: int, heads: int, ffn: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(DecoderBlock(hidden, heads, ffn) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_decoder(hidden: int, layers: int, heads: int, ffn: int, vocab: int) -> nn.Module:
    return Decoder(hidden, layers, heads, ffn, vocab)
