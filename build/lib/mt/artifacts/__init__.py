"""What a run leaves behind: the self-describing checkpoint and the CTranslate2 export."""
