"""The user's own files: config, directories, chat history store, export, clipboard and key map."""
