"""lipline services: one package per pipeline stage, plus `common` shared by all of them."""
