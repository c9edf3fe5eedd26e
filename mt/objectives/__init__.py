"""Training objectives: label-smoothed cross-entropy, R-Drop, scheduled sampling, the NAT and
masked-LM losses."""
