"""Pure math and text: sampling, the figures of a generation, streaming text. Imports nothing of localspec but the settings table."""
