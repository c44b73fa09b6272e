"""What each head does across a corpus, not on one prompt: streamed statistics and top examples."""
