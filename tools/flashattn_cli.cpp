// Placeholder main until the CLI lands (in progress this session).
#include <cstdio>
int main() { std::puts("flashattn: CLI not implemented yet"); return 1; }
