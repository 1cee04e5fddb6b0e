"""Mitigations of phase sensitivity (staggered windows live in the model; here: the coverage regulariser,
phase ensembling at test time), the comparison table and the one-command phase audit."""
