"""A small PyTorch MLP with exact GELU: exportgate's bundled example model."""

import torch
from torch import nn


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
    return model.eval(), (torch.randn(8, 16),)
