// Linked with every generated header translation unit: a header that defines a function without `inline`
// makes this link fail with a multiple definition.
int main() { return 0; }
