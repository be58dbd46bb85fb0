"""What users run: the command line, the chat REPL, the server, the bench and doctor."""
