"""Answer checking. `boxed` is the minimal checker (last \\boxed{}, exact match) the toy task needs."""
