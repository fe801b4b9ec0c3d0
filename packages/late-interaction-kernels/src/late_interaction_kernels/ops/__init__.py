"""Operations of late-interaction scoring, one folder per op; :mod:`.common` holds the kernel
building blocks and helpers that several of them share."""
