"""One screen per wizard step, plus Start, Chat, help and the confirmation dialog."""
