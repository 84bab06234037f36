"""The Controls dock's panels and the panels around the plots (tokens, runs) that every mode shares."""
