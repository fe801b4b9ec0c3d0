"""Operations of late-interaction scoring, one folder per op."""
