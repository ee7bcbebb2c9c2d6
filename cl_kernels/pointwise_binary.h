// The binary formulas of the pointwise family (clnet/pointwise.py BINARY): bf(op, a, b) in a working type, the
// op number chosen at run time; comparisons and logical ops give 0 or 1. Included once per working type (no
// include guard): pointwise.cl once for its TW, chain.cl once for each of float, int and uchar.
// Defines it reads: BW (the working type), BW_FLOAT (0/1: BW is float), BW_NAME(f) (f's name for this type).
#ifndef BW
#define BW float        // the working type
#endif
#ifndef BW_FLOAT
#define BW_FLOAT 1     // BW is float
#endif
#ifndef BW_NAME
#define BW_NAME(f) f   // names as they are
#endif

inline BW BW_NAME(floor_div)(const BW a, const BW b) {
#if BW_FLOAT
    return floor(a / b);
#else
    const BW q = a / b;
    return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
#endif
}

inline BW BW_NAME(py_rem)(const BW a, const BW b) {
#if BW_FLOAT
    const BW r = fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
#else
    const BW r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
#endif
}

inline BW BW_NAME(bf)(const int op, const BW a, const BW b) {
    switch (op) {
        case 1: return a + b;
        case 2: return a - b;
        case 3: return a * b;
        case 4: return a / b;
#if BW_FLOAT
        case 5: return pow(a, b);
#endif
        case 6: return a != a || a > b ? a : b;                                     // maximum: NaN propagates
        case 7: return a != a || a < b ? a : b;                                     // minimum
        case 8: return a < b;
        case 9: return a <= b;
        case 10: return a > b;
        case 11: return a >= b;
        case 12: return a == b;
        case 13: return a != b;
        case 14: return a != 0 && b != 0;
        case 15: return a != 0 || b != 0;
        case 16: return BW_NAME(floor_div)(a, b);
        case 17: return BW_NAME(py_rem)(a, b);
#if !BW_FLOAT
        case 18: return a & b;                                                      // bitwise (int32, or bool's 0/1)
        case 19: return a | b;
        case 20: return a ^ b;
#endif
        default: return 0;
    }
}
