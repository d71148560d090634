"""The app/engine contract (`contract`) and the engines that keep it: `local` (MLX on this machine),
`remote` (an OpenAI-compatible server), plus `pairings` (every PairingSpec the app opens)."""
