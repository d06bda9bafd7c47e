"""Source models traced op by op on one batch, for localising a divergence (verifiers.localization.trace):
one module per framework, imported by its Framework.trace."""
